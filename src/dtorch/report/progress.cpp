// Progress formatting (pure, tested on numbers) and the reporter that throttles it: a bar
// redraws at most ~10 times a second so printing never shows up in the step time.
#include "dtorch/report/progress.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace dtorch::report {

const NameTable<ProgressConfig::Mode>& names(ProgressConfig::Mode) {
  using M = ProgressConfig::Mode;
  static const NameTable<M> n{
      {M::Auto, "auto"}, {M::Bar, "bar"}, {M::Lines, "lines"}, {M::Off, "off"}};
  return n;
}

namespace {

std::string printf_string(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// "epoch 2/5" (1-based for people), or "epoch 2" when the run length is unknown.
std::string epoch_text(const ProgressState& s) {
  std::string t = "epoch " + std::to_string(s.epoch + 1);
  if (s.epochs > 0) t += "/" + std::to_string(s.epochs);
  return t;
}

std::string steps_text(const ProgressState& s) {
  std::string t = std::to_string(s.step);
  if (s.total_steps > 0) t += "/" + std::to_string(s.total_steps);
  return t;
}

// Loss, throughput and time: the part both formats share.
std::string tail_text(const ProgressState& s) {
  std::string t = " loss " + printf_string("%.4f", s.loss);
  t += " " + format_rate(s.samples_per_s) + " samples/s";
  if (s.total_steps > 0 && s.step >= s.total_steps)
    t += " took " + format_eta(s.elapsed_seconds);
  else
    t += " ETA " + format_eta(s.eta_seconds);
  return t;
}

double steady_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const long long total = std::llround(seconds);
  const long long h = total / 3600, m = (total / 60) % 60, sec = total % 60;
  char buf[48];
  if (h > 0)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", h, m, sec);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", m, sec);
  return buf;
}

std::string format_rate(double per_second) {
  if (!std::isfinite(per_second) || per_second < 0) return "-";
  if (per_second < 999.5) return printf_string("%.0f", per_second);
  if (per_second < 999.95e3) return printf_string("%.1fk", per_second / 1e3);
  return printf_string("%.2fM", per_second / 1e6);
}

std::string format_bar(const ProgressState& s, int width) {
  std::string bar;
  if (s.total_steps > 0 && width > 0) {
    const int64_t step = std::min(std::max<int64_t>(s.step, 0), s.total_steps);
    const int64_t filled = step * width / s.total_steps;
    bar = " [" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
  }
  return epoch_text(s) + bar + " " + steps_text(s) + tail_text(s);
}

std::string format_line(const ProgressState& s) {
  return epoch_text(s) + " step " + steps_text(s) + tail_text(s);
}

bool stderr_is_terminal() {
  const char* forced = std::getenv("DTORCH_STDERR_TTY");
  if (forced && std::strcmp(forced, "1") == 0) return true;
  return ::isatty(STDERR_FILENO) == 1;
}

ProgressReporter::ProgressReporter(ProgressConfig config, std::FILE* out,
                                   std::function<double()> clock)
    : config_(config), mode_(config.mode), out_(out), clock_(std::move(clock)) {
  if (!clock_) clock_ = steady_seconds;
  if (mode_ == ProgressConfig::Mode::Auto)
    mode_ = stderr_is_terminal() ? ProgressConfig::Mode::Bar : ProgressConfig::Mode::Lines;
}

void ProgressReporter::start_epoch(int64_t epoch, int64_t epochs, int64_t total_steps) {
  state_ = ProgressState{};
  state_.epoch = epoch;
  state_.epochs = epochs;
  state_.total_steps = total_steps;
  samples_ = 0;
  epoch_start_ = last_print_ = clock_();
  last_print_step_ = 0;
  last_bar_len_ = 0;
  printed_ = false;
}

ProgressState ProgressReporter::state_at(double now) const {
  ProgressState s = state_;
  s.elapsed_seconds = now - epoch_start_;
  if (s.elapsed_seconds > 0) s.samples_per_s = samples_ / s.elapsed_seconds;
  if (s.total_steps > 0 && s.step > 0)
    s.eta_seconds = (s.total_steps - s.step) * s.elapsed_seconds / s.step;
  return s;
}

void ProgressReporter::update(int64_t step, double loss, int64_t samples) {
  update(
      step, [loss] { return loss; }, samples);
}

void ProgressReporter::update(int64_t step, std::function<double()> loss, int64_t samples) {
  state_.step = step;
  loss_ = std::move(loss);
  samples_ = samples;
  if (mode_ == ProgressConfig::Mode::Off) return;
  const double now = clock_();
  bool due = false;
  if (mode_ == ProgressConfig::Mode::Bar) {
    due = !printed_ || now - last_print_ >= config_.bar_interval_seconds;
  } else {
    due = (config_.every_steps > 0 && step - last_print_step_ >= config_.every_steps) ||
          (config_.every_seconds > 0 && now - last_print_ >= config_.every_seconds);
  }
  if (!due) return;
  last_print_ = now;
  last_print_step_ = step;
  state_.loss = loss_();
  print(state_at(now), /*final=*/false);
}

void ProgressReporter::finish_epoch() {
  if (mode_ == ProgressConfig::Mode::Off) return;
  // A line already printed for the last step says everything; do not repeat it.
  if (mode_ == ProgressConfig::Mode::Lines && printed_ && last_print_step_ == state_.step) return;
  if (loss_) state_.loss = loss_();
  print(state_at(clock_()), /*final=*/true);
}

void ProgressReporter::print(const ProgressState& s, bool final) {
  printed_ = true;
  std::string text;
  if (mode_ == ProgressConfig::Mode::Bar) {
    std::string line = format_bar(s, config_.bar_width);
    // Blank out what is left of a longer previous line instead of relying on escape codes,
    // which a log file or a launcher's line prefixer would keep as garbage.
    const size_t len = line.size();
    if (len < last_bar_len_) line += std::string(last_bar_len_ - len, ' ');
    last_bar_len_ = len;
    text = "\r" + line + (final ? "\n" : "");
  } else {
    text = format_line(s) + "\n";
  }
  std::fwrite(text.data(), 1, text.size(), out_);
  std::fflush(out_);
}

}  // namespace dtorch::report
