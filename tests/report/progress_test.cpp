// Tests for progress output: the pure formatters on fixed numbers, and the reporter's
// throttling in bar and line modes driven by a fake clock.
#include "dtorch/report/progress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace dtorch::report {
namespace {

TEST(Progress, FormatEta) {
  EXPECT_EQ(format_eta(0), "0:00");
  EXPECT_EQ(format_eta(42.4), "0:42");
  EXPECT_EQ(format_eta(61.6), "1:02");
  EXPECT_EQ(format_eta(3599.4), "59:59");
  EXPECT_EQ(format_eta(3600), "1:00:00");
  EXPECT_EQ(format_eta(3725), "1:02:05");
  EXPECT_EQ(format_eta(100 * 3600 + 1), "100:00:01");
  EXPECT_EQ(format_eta(-1), "--:--");
  EXPECT_EQ(format_eta(std::nan("")), "--:--");
  EXPECT_EQ(format_eta(std::numeric_limits<double>::infinity()), "--:--");
}

TEST(Progress, FormatRate) {
  EXPECT_EQ(format_rate(0), "0");
  EXPECT_EQ(format_rate(950.2), "950");
  EXPECT_EQ(format_rate(999.7), "1.0k");
  EXPECT_EQ(format_rate(12345), "12.3k");
  EXPECT_EQ(format_rate(1234567), "1.23M");
  EXPECT_EQ(format_rate(std::nan("")), "-");
}

ProgressState sample_state() {
  ProgressState s;
  s.epoch = 1;
  s.epochs = 5;
  s.step = 469;
  s.total_steps = 938;
  s.loss = 0.43125;
  s.samples_per_s = 12345;
  s.eta_seconds = 42;
  s.elapsed_seconds = 42;
  return s;
}

TEST(Progress, FormatBarAndLine) {
  ProgressState s = sample_state();
  EXPECT_EQ(format_bar(s, 10),
            "epoch 2/5 [#####.....] 469/938 loss 0.4313 12.3k samples/s ETA 0:42");
  EXPECT_EQ(format_line(s), "epoch 2/5 step 469/938 loss 0.4313 12.3k samples/s ETA 0:42");
  s.step = 938;
  s.elapsed_seconds = 84;
  EXPECT_EQ(format_bar(s, 4), "epoch 2/5 [####] 938/938 loss 0.4313 12.3k samples/s took 1:24");
  // Unknown totals: no bar, no denominators, no ETA.
  ProgressState u;
  u.step = 3;
  u.loss = 2.5;
  EXPECT_EQ(format_bar(u, 10), "epoch 1 3 loss 2.5000 0 samples/s ETA --:--");
  EXPECT_EQ(format_line(u), "epoch 1 step 3 loss 2.5000 0 samples/s ETA --:--");
}

// Runs a reporter over `steps` steps, the clock advancing `dt` per step; returns its output.
std::string run_reporter(ProgressConfig cfg, int steps, double dt) {
  std::FILE* f = std::tmpfile();
  double now = 100;
  {
    ProgressReporter r(cfg, f, [&] { return now; });
    r.start_epoch(0, 2, steps);
    for (int i = 1; i <= steps; ++i) {
      now += dt;
      r.update(i, 1.0 / i, i * 64);
    }
    r.finish_epoch();
  }
  std::string out;
  std::rewind(f);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
    out.append(buf, n);
  std::fclose(f);
  return out;
}

size_t count(const std::string& s, char c) {
  return std::count(s.begin(), s.end(), c);
}

TEST(Progress, LinesEveryNSteps) {
  ProgressConfig cfg;
  cfg.mode = ProgressConfig::Mode::Lines;
  cfg.every_steps = 10;
  cfg.every_seconds = 0;
  std::string out = run_reporter(cfg, 25, 0.5);
  EXPECT_EQ(count(out, '\n'), 3u) << out;  // steps 10, 20, and the end
  EXPECT_EQ(count(out, '\r'), 0u);
  EXPECT_NE(out.find("epoch 1/2 step 10/25 loss 0.1000 128 samples/s ETA 0:08\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("step 25/25 loss 0.0400 128 samples/s took 0:13\n"), std::string::npos) << out;
  // When the last step already printed, the end adds nothing.
  EXPECT_EQ(count(run_reporter(cfg, 20, 0.5), '\n'), 2u);
}

TEST(Progress, LinesEveryNSeconds) {
  ProgressConfig cfg;
  cfg.mode = ProgressConfig::Mode::Lines;
  cfg.every_seconds = 10;
  std::string out = run_reporter(cfg, 100, 1.0);  // 100 s: lines at 10, 20, ... 100
  EXPECT_EQ(count(out, '\n'), 10u) << out;
}

TEST(Progress, BarIsThrottledAndEndsWithNewline) {
  ProgressConfig cfg;
  cfg.mode = ProgressConfig::Mode::Bar;
  cfg.bar_interval_seconds = 0.125;                    // binary fractions: exact clock sums
  std::string out = run_reporter(cfg, 640, 1.0 / 64);  // 10 s: a redraw every 8 steps
  EXPECT_EQ(count(out, '\r'), 81u);                    // 80 throttled redraws + the final one
  EXPECT_EQ(count(out, '\n'), 1u);
  EXPECT_EQ(out.back(), '\n');
  EXPECT_NE(out.find("[####################] 640/640"), std::string::npos);
}

TEST(Progress, OffPrintsNothing) {
  ProgressConfig cfg;
  cfg.mode = ProgressConfig::Mode::Off;
  EXPECT_EQ(run_reporter(cfg, 50, 1.0), "");
}

TEST(Progress, LauncherCanDeclareATerminal) {
  const char* old = std::getenv("DTORCH_STDERR_TTY");
  std::string saved = old ? old : "";
  ::setenv("DTORCH_STDERR_TTY", "1", 1);
  EXPECT_TRUE(stderr_is_terminal());
  ProgressReporter r(ProgressConfig{}, std::tmpfile());
  EXPECT_EQ(r.mode(), ProgressConfig::Mode::Bar);
  if (old)
    ::setenv("DTORCH_STDERR_TTY", saved.c_str(), 1);
  else
    ::unsetenv("DTORCH_STDERR_TTY");
}

}  // namespace
}  // namespace dtorch::report
