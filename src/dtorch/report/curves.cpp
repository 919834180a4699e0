// Training curves (curves.h): metrics.jsonl into series, series into panels.
#include "dtorch/report/curves.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <sstream>

#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"
#include "dtorch/report/metrics.h"

namespace dtorch::report {
namespace {

using Point = RunCurves::Point;
using Series = std::vector<Point>;

// A number of a record, or NaN (null, absent: a non-finite value was written as null).
double number(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>()
                                          : std::numeric_limits<double>::quiet_NaN();
}

void add(Series& s, double x, double y) {
  if (std::isfinite(x) && std::isfinite(y)) s.push_back({x, y});
}

// "12.3k", "0.001", "2500": four significant digits at most, no exponents under 10^4.
std::string short_number(double v) {
  const double a = std::abs(v);
  std::ostringstream os;
  os.precision(a >= 1e4 ? 3 : 4);
  if (a >= 1e6) {
    os << v / 1e6 << "M";
  } else if (a >= 1e4) {
    os << v / 1e3 << "k";
  } else {
    os << v;
  }
  return os.str();
}

const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                          "#9467bd", "#8c564b", "#e377c2", "#17becf"};
Color run_color(size_t i) {
  return Color::hex(kPalette[i % (sizeof kPalette / sizeof kPalette[0])]);
}

const Color kInk{51, 51, 51}, kGrid{230, 230, 230}, kEpoch{200, 200, 200};

// One panel of line series: axes from the data, a grid at the ticks, epoch ends as light
// vertical lines, and each series in its run's colour (markers on the per-epoch ones).
struct LinePanel {
  std::string title;
  struct Line {
    const Series* points;
    Color color;
    bool markers;
  };
  std::vector<Line> lines;
  std::vector<double> epoch_ends;
  std::string x_label;
};

void draw_line_panel(Picture& p, const LinePanel& panel, double left, double top, double width,
                     double height) {
  p.text(left, top - 8, panel.title, 13, kInk);
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& l : panel.lines) {
    for (const auto& pt : *l.points) {
      x0 = std::min(x0, pt.x), x1 = std::max(x1, pt.x);
      y0 = std::min(y0, pt.y), y1 = std::max(y1, pt.y);
    }
  }
  p.box(left, top, width, height, {255, 255, 255}, kInk);
  if (!std::isfinite(x0)) {
    p.text(left + width / 2, top + height / 2, "not recorded", 11, kInk, Picture::Anchor::Middle);
    return;
  }
  x0 = std::min(x0, 0.0);
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + std::max(1e-12, std::abs(y0) * 0.1), y0 -= std::abs(y0) * 0.1;
  const auto yt = nice_ticks(y0, y1), xt = nice_ticks(x0, x1);
  y0 = std::min(y0, yt.front()), y1 = std::max(y1, yt.back());
  x1 = std::max(x1, xt.back());
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * width; };
  auto Y = [&](double y) { return top + height - (y - y0) / (y1 - y0) * height; };
  for (double t : yt) {
    p.line({{left, Y(t)}, {left + width, Y(t)}}, kGrid);
    p.text(left - 4, Y(t) + 4, short_number(t), 10, kInk, Picture::Anchor::End);
  }
  for (double t : xt) {
    if (t < x0 || t > x1) continue;
    p.text(X(t), top + height + 13, short_number(t), 10, kInk, Picture::Anchor::Middle);
  }
  for (double e : panel.epoch_ends)
    if (e > x0 && e < x1) p.line({{X(e), top}, {X(e), top + height}}, kEpoch);
  p.text(left + width, top + height + 26, panel.x_label, 10, kInk, Picture::Anchor::End);
  for (const auto& l : panel.lines) {
    std::vector<std::pair<double, double>> pts;
    for (const auto& pt : *l.points)
      pts.emplace_back(X(pt.x), Y(pt.y));
    if (pts.size() > 1) p.line(pts, l.color, 1.5);
    if (l.markers || pts.size() == 1) {
      for (const auto& [x, y] : pts)
        p.box(x - 2.5, y - 2.5, 5, 5, l.color);
    }
  }
}

// Each step phase's colour, in the order of kStepPhases.
constexpr const char* kPhaseFills[] = {"#bdbdbd", "#6baed6", "#fd8d3c", "#9e9ac8", "#74c476"};
static_assert(std::size(kPhaseFills) == std::size(kStepPhases), "one colour per step phase");

// The height of the phase panel for `runs` bars.
double phase_panel_height(size_t runs) {
  return 50 + 30 * static_cast<double>(runs);
}

// Stacked bars, one per run, of the milliseconds each phase of a step takes.
void draw_phase_panel(Picture& p, const std::vector<RunCurves>& runs, double left, double top,
                      double width) {
  const double height = phase_panel_height(runs.size());
  p.text(left, top - 8, "ms per optimizer step, by phase (last epoch)", 13, kInk);
  p.box(left, top, width, height, {255, 255, 255}, kInk);
  double most = 0;
  for (const auto& r : runs) {
    double total = 0;
    for (const auto& [phase, ms] : r.phase_ms)
      total += ms;
    most = std::max(most, total);
  }
  if (most <= 0) return;
  const auto ticks = nice_ticks(0, most);
  const double scale = (width - 10) / std::max(most, ticks.back());
  for (double t : ticks) {
    p.line({{left + t * scale, top}, {left + t * scale, top + height - 30}}, kGrid);
    p.text(left + t * scale, top + height - 18, short_number(t), 10, kInk, Picture::Anchor::Middle);
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const double y = top + 8 + 30 * static_cast<double>(i);
    double x = left;
    for (size_t k = 0; k < std::size(kStepPhases); ++k) {
      auto it = runs[i].phase_ms.find(kStepPhases[k]);
      if (it == runs[i].phase_ms.end()) continue;
      p.box(x, y, it->second * scale, 22, Color::hex(kPhaseFills[k]), kInk);
      x += it->second * scale;
    }
    p.box(left - 12, y + 7, 8, 8, run_color(i));
  }
  double x = left;
  for (size_t k = 0; k < std::size(kStepPhases); ++k) {
    const char* phase = kStepPhases[k];
    const bool recorded = std::any_of(runs.begin(), runs.end(),
                                      [&](const auto& r) { return r.phase_ms.count(phase); });
    if (!recorded) continue;
    p.box(x, top + height - 10, 8, 8, Color::hex(kPhaseFills[k]));
    p.text(x + 11, top + height - 2, phase, 10, kInk);
    x += Picture::text_width(std::string(phase).size(), 10) + 24;
  }
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int count) {
  if (!(hi > lo)) hi = lo + 1;
  count = std::max(1, count);
  const double raw = (hi - lo) / count;
  // A range wider than a double holds, or too narrow for its magnitude to step through (values
  // from a damaged metrics file): just its ends.
  if (!std::isfinite(raw) || !(raw > 0)) return {lo, hi};
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  const double first = std::floor(lo / step);
  for (int i = 0; i <= count + 2; ++i) {
    const double t = (first + i) * step;
    if (!ticks.empty() && !(t > ticks.back())) break;  // steps lost to rounding
    ticks.push_back(t);
    if (t >= hi) return ticks;
  }
  return {lo, hi};
}

RunCurves parse_run_curves(const std::string& text, const std::string& name,
                           const std::string& label) {
  RunCurves c;
  c.label = label;
  std::map<int64_t, nlohmann::json> epochs;  // a resumed run's repeated epoch: the last one
  std::vector<nlohmann::json> steps;
  std::istringstream in(text);
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    DTORCH_CHECK_T(DataError, j.is_object(), name, ":", line_number,
                   ": not a JSON object; metrics.jsonl holds one record per line (a run that was "
                   "killed mid-write leaves a partial last line: delete it)");
    const std::string kind =
        j.contains("kind") && j["kind"].is_string() ? j["kind"].get<std::string>() : "";
    const double epoch = number(j, "epoch");
    DTORCH_CHECK_T(
        DataError, kind != "epoch" || (std::trunc(epoch) == epoch && epoch >= 0 && epoch < 1e9),
        name, ":", line_number, ": an epoch record whose \"epoch\" is not a whole number ",
        "from 0 (got ", j.contains("epoch") ? j["epoch"].dump() : "none",
        "); metrics.jsonl is written by dtorch train: restore it or plot another run");
    if (kind == "epoch") epochs[static_cast<int64_t>(epoch)] = j;
    if (kind == "step") steps.push_back(j);
  }
  DTORCH_CHECK_T(ConfigError, !epochs.empty() || !steps.empty(), name,
                 " has no epoch or step records yet: plot it after the first epoch ends (or "
                 "train with --print-every N for step records)");
  c.x_is_step = std::all_of(epochs.begin(), epochs.end(),
                            [](const auto& e) { return e.second.contains("step"); });
  for (const auto& [epoch, j] : epochs) {
    const double x = c.x_is_step ? number(j, "step") : static_cast<double>(epoch + 1);
    c.epoch_ends.push_back(x);
    add(c.test_loss, x, number(j, "test_loss"));
    add(c.test_accuracy, x, 100 * number(j, "test_accuracy"));
    if (steps.empty() || !c.x_is_step) {
      add(c.train_loss, x, number(j, "train_loss"));
      add(c.samples_per_s, x, number(j, "samples_per_s"));
      add(c.lr, x, number(j, "lr"));
    }
    c.phase_ms.clear();
    for (const auto& [key, value] : j.items()) {
      const size_t n = key.size();
      if (n > 3 && key.compare(n - 3, 3, "_ms") == 0 && value.is_number())
        c.phase_ms[key.substr(0, n - 3)] = value.get<double>();
    }
  }
  if (c.x_is_step) {
    for (const auto& j : steps) {
      const double x = number(j, "step");
      add(c.train_loss, x, number(j, "train_loss"));
      add(c.samples_per_s, x, number(j, "samples_per_s"));
      add(c.lr, x, number(j, "lr"));
    }
  }
  for (auto* s : {&c.train_loss, &c.samples_per_s, &c.lr}) {
    std::stable_sort(s->begin(), s->end(), [](Point a, Point b) { return a.x < b.x; });
  }
  return c;
}

RunCurves read_run_curves(const std::string& run_dir, const std::string& label) {
  const std::string path = run_dir + "/metrics.jsonl";
  std::string text, problem;
  DTORCH_CHECK_T(ConfigError, read_input_file(path, uint64_t{1} << 32, &text, &problem), path, ": ",
                 problem, "; give the --out folder of a dtorch train run");
  return parse_run_curves(text, path, label);
}

Picture draw_curves(const std::vector<RunCurves>& runs, const std::string& title) {
  DTORCH_CHECK_T(ConfigError, !runs.empty(), "dtorch plot: give at least one run folder");
  const bool steps = std::all_of(runs.begin(), runs.end(), [](auto& r) { return r.x_is_step; });
  const std::string x_label = steps ? "optimizer step (grey lines: epoch ends)" : "epoch";
  auto lines_of = [&](Series RunCurves::*series, bool markers) {
    std::vector<LinePanel::Line> lines;
    for (size_t i = 0; i < runs.size(); ++i)
      lines.push_back({&(runs[i].*series), run_color(i), markers});
    return lines;
  };
  std::vector<LinePanel> panels(4);
  panels[0].title = "loss (line: train, squares: test)";
  panels[0].lines = lines_of(&RunCurves::train_loss, false);
  for (auto& l : lines_of(&RunCurves::test_loss, true))
    panels[0].lines.push_back(l);
  panels[1].title = "test accuracy (%)";
  panels[1].lines = lines_of(&RunCurves::test_accuracy, true);
  panels[2].title = "samples/s (all ranks)";
  panels[2].lines = lines_of(&RunCurves::samples_per_s, false);
  panels[3].title = "learning rate";
  panels[3].lines = lines_of(&RunCurves::lr, false);
  // The epoch ends of the first run (runs of one length share them).
  for (auto& panel : panels) {
    panel.epoch_ends = steps ? runs.front().epoch_ends : std::vector<double>{};
    panel.x_label = x_label;
  }
  const bool phases =
      std::any_of(runs.begin(), runs.end(), [](auto& r) { return !r.phase_ms.empty(); });

  const double pw = 420, ph = 200, left = 70, gap_x = 90, gap_y = 80, top = 80;
  const double phase_top = top + 2 * (ph + gap_y);
  const double legend_top =
      phases ? phase_top + phase_panel_height(runs.size()) + 30 : phase_top - 30;
  const double height = legend_top + 20 * static_cast<double>(runs.size()) + 20;
  Picture p(static_cast<int>(left + 2 * pw + gap_x + 30), static_cast<int>(height));
  p.text(left, 30, title, 16, kInk);
  for (size_t i = 0; i < panels.size(); ++i) {
    const double x = left + static_cast<double>(i % 2) * (pw + gap_x);
    const double y = top + static_cast<double>(i / 2) * (ph + gap_y);
    draw_line_panel(p, panels[i], x, y, pw, ph);
  }
  if (phases) draw_phase_panel(p, runs, left, phase_top, 2 * pw + gap_x);
  for (size_t i = 0; i < runs.size(); ++i) {
    const double y = legend_top + 20 * static_cast<double>(i);
    p.line({{left, y}, {left + 24, y}}, run_color(i), 3);
    p.text(left + 32, y + 4, runs[i].label, 11, kInk);
  }
  return p;
}

}  // namespace dtorch::report
