// Reads text files as byte tokens and gathers windows of them into batches. Bytes, not
// characters: any file is valid input and the vocabulary is fixed at 256.
#include "dtorch/data/text_dataset.h"

#include <algorithm>
#include <iterator>

#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"
#include "dtorch/core/paths.h"

namespace dtorch::data {
namespace {

std::string fix_hint(bool is_default) {
  if (is_default) {
    return str("install the default corpus with `apt-get install fortunes` (it goes to ",
               kDefaultTextDir, "), or pass the path of a text file or folder of text files");
  }
  return "pass the path of a non-empty text file or folder of text files (or none, for the "
         "default corpus from `apt-get install fortunes`)";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The files a folder contributes, sorted by name so every rank reads the same text.
std::vector<std::string> text_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const std::string& name : paths::list_directory(dir, ec)) {  // sorted
    // fortune's strfile writes NAME.dat (binary index); NAME.u8 is a symlink to NAME.
    if (name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
    const std::string path = paths::join(dir, name);
    if (paths::is_symlink(path) || !paths::is_regular_file(path)) continue;
    files.push_back(path);
  }
  return files;
}

void append_file(const std::string& path, std::string* bytes, const std::string& hint) {
  std::string text, problem;
  DTORCH_CHECK_T(DataError, read_input_file(path, kAnySize, &text, &problem), "text file ", path,
                 ": ", problem, "; ", hint);
  bytes->append(text);
}

}  // namespace

TextData load_text(const std::string& spec) {
  const bool is_default = spec.empty();
  const std::string path = is_default ? std::string(kDefaultTextDir) : spec;
  const std::string hint = fix_hint(is_default);
  DTORCH_CHECK_T(DataError, paths::exists(path), "text corpus ", path, " does not exist: ", hint);
  std::string bytes;
  if (paths::is_directory(path)) {
    const auto files = text_files(path);
    DTORCH_CHECK_T(DataError, !files.empty(), "text folder ", path,
                   " holds no text files (hidden, *.dat and *.u8 files are skipped): ", hint);
    for (const auto& f : files)
      append_file(f, &bytes, hint);
  } else {
    append_file(path, &bytes, hint);
  }
  DTORCH_CHECK_T(DataError, !bytes.empty(), "text corpus ", path, " is empty: ", hint);

  TextData out;
  out.source = path;
  out.tokens = torch::from_blob(bytes.data(), {int64_t(bytes.size())}, torch::kUInt8)
                   .to(torch::kLong);  // a copy: `bytes` dies here
  return out;
}

TextSplits split_text(const TextData& text, double val_fraction) {
  DTORCH_CHECK_T(ConfigError, val_fraction >= 0.0 && val_fraction < 1.0, "validation fraction ",
                 val_fraction, " must be in [0, 1)");
  const int64_t n = text.size();
  const int64_t n_val = static_cast<int64_t>(double(n) * val_fraction);
  TextSplits s;
  s.train = {text.tokens.slice(0, 0, n - n_val), text.source + " (train)"};
  s.val = {text.tokens.slice(0, n - n_val, n), text.source + " (validation)"};
  return s;
}

int64_t num_windows(const TextData& text, int64_t seq_len) {
  DTORCH_CHECK_T(ConfigError, seq_len >= 1, "sequence length ", seq_len, " must be at least 1");
  const int64_t n = text.size();
  DTORCH_CHECK_T(DataError, n >= seq_len + 1, "text ", text.source, " has ", n,
                 " tokens, too few for one window of ", seq_len, " inputs and ", seq_len,
                 " targets (", seq_len + 1,
                 " tokens): use a longer text or a shorter sequence "
                 "length");
  return (n - 1) / seq_len;
}

TextBatch text_batch(const TextData& text, const std::vector<int64_t>& windows, int64_t seq_len) {
  const int64_t count = num_windows(text, seq_len);
  std::vector<torch::Tensor> rows;
  rows.reserve(windows.size());
  for (int64_t w : windows) {
    DTORCH_CHECK_T(DataError, w >= 0 && w < count, "window ", w, " is outside 0..", count - 1,
                   " of text ", text.source, " at sequence length ", seq_len);
    rows.push_back(text.tokens.slice(0, w * seq_len, w * seq_len + seq_len + 1));
  }
  DTORCH_CHECK_T(DataError, !rows.empty(), "text_batch needs at least one window");
  torch::Tensor stacked = torch::stack(rows);  // B x (T + 1)
  return {stacked.slice(1, 0, seq_len).contiguous(), stacked.slice(1, 1, seq_len + 1).contiguous()};
}

}  // namespace dtorch::data
