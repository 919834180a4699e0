// Line splitting and prefixing of worker output (see line_prefixer.h). Pure string code, so
// every case of newlines, carriage returns and chunk boundaries is unit-tested without processes.
#include "dtorch/launch/line_prefixer.h"

#include <utility>

namespace dtorch::launch {

std::string rank_prefix(int node_rank, int global_rank, const std::string& host) {
  return "[" + (host.empty() ? "" : host + " ") + "n" + std::to_string(node_rank) + " r" +
         std::to_string(global_rank) + "] ";
}

LinePrefixer::LinePrefixer(std::string prefix, std::size_t max_line)
    : prefix_(std::move(prefix)), max_line_(max_line < 1 ? 1 : max_line) {}

void LinePrefixer::feed(std::string_view chunk, std::string& out) {
  while (!chunk.empty()) {
    // See Note [Carriage returns]: "\r\n" ends one line, not two.
    if (after_cr_ && partial_.empty() && chunk.front() == '\n') {
      out += '\n';
      after_cr_ = in_update_ = false;
      chunk.remove_prefix(1);
      continue;
    }
    after_cr_ = false;
    std::size_t end = chunk.find_first_of("\r\n");
    std::string_view text = chunk.substr(0, end);
    if (partial_.size() + text.size() > max_line_) {
      // Cut an overlong line; the rest continues as a new prefixed line.
      std::size_t take = max_line_ - partial_.size();
      out += prefix_;
      out += partial_;
      out.append(text.substr(0, take));
      out += '\n';
      partial_.clear();
      shown_ = 0;
      in_update_ = false;
      chunk.remove_prefix(take);
      continue;
    }
    if (end == std::string_view::npos) {
      partial_.append(text);
      break;
    }
    char terminator = chunk[end];
    bool unseen = partial_.size() + text.size() > shown_;
    if (terminator == '\r' && !unseen) {
      // A bare '\r' only returns the cursor; an update shown early is already on screen.
      if (partial_.empty()) out += '\r';
    } else {
      out += prefix_;
      out += partial_;
      out.append(text);
      out += terminator;
    }
    partial_.clear();
    shown_ = 0;
    after_cr_ = in_update_ = terminator == '\r';
    chunk.remove_prefix(end + 1);
  }
  // See Note [Carriage returns]: an update in progress shows now, not when the next one comes.
  if (in_update_ && partial_.size() > shown_) {
    out += prefix_;
    out += partial_;
    out += '\r';
    shown_ = partial_.size();
    after_cr_ = true;
  }
}

void LinePrefixer::finish(std::string& out) {
  if (partial_.empty()) return;
  out += prefix_;
  out += partial_;
  out += '\n';
  partial_.clear();
  shown_ = 0;
  after_cr_ = in_update_ = false;
}

}  // namespace dtorch::launch
