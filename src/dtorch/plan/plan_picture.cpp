// plan_picture (plan_picture.h): stacked bars scaled to the longest step shown.
#include "dtorch/plan/plan_picture.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "dtorch/core/error.h"

namespace dtorch::plan {

Picture plan_picture(const std::vector<Prediction>& rows, const std::vector<double>& measured_s,
                     const Workload& w, const std::string& title) {
  const double left = 44, bar = 420, row = 24, top = 44;
  auto measured = [&](size_t i) { return i < measured_s.size() ? measured_s[i] : 0.0; };
  double longest = 1e-12;
  std::vector<std::string> labels;
  size_t widest = title.size();
  for (size_t i = 0; i < rows.size(); ++i) {
    longest = std::max({longest, rows[i].step_s(), measured(i)});
    // The layout's own flags: --model and --seq-len are the plan's.
    const std::string flags = flags_of(rows[i].layout, w);
    std::ostringstream label;
    label << std::setprecision(3) << rows[i].step_s() << " s";
    if (measured(i) > 0) label << " (measured " << std::setprecision(3) << measured(i) << " s)";
    label << "  " << flags.substr(flags.find("--batch-size"));
    if (!rows[i].fits) label << "  (does not fit)";
    labels.push_back(label.str());
    widest = std::max(widest, labels.back().size());
  }
  const double text_x = left + bar + 10;
  const int width = static_cast<int>(std::ceil(text_x + Picture::text_width(widest) + 20));
  Picture p(std::max(width, 600), static_cast<int>(top + rows.size() * row + 40));
  const Color ink{51, 51, 51};
  const Color parts[] = {Color::hex("#6baed6"), Color::hex("#fdae6b"), Color::hex("#cccccc"),
                         Color::hex("#74c476")};
  p.text(left, 24, title, 14);
  for (size_t i = 0; i < rows.size(); ++i) {
    const double y = top + i * row;
    p.text(8, y + row / 2 + 2, str("#", i + 1));
    double x = left;
    const double seconds[] = {rows[i].compute_s, rows[i].exposed_comm_s, rows[i].bubble_s,
                              rows[i].offload_s};
    for (int k = 0; k < 4; ++k) {
      const double dx = seconds[k] / longest * bar;
      if (dx > 0) p.box(x, y, dx, row - 8, parts[k]);
      x += dx;
    }
    if (measured(i) > 0) {
      const double xm = left + measured(i) / longest * bar;
      p.line({{xm, y - 2}, {xm, y + row - 6}}, ink, 2);
    }
    p.text(text_x, y + row / 2 + 2, labels[i]);
  }
  const double legend_y = top + rows.size() * row + 14;
  const char* names[] = {"compute", "exposed communication", "pipeline bubble",
                         "optimizer state on disk"};
  bool disk = false;  // its legend where a layout keeps the state there
  for (const Prediction& r : rows)
    disk = disk || r.layout.offload;
  double x = left;
  for (int k = 0; k < (disk ? 4 : 3); ++k) {
    p.box(x, legend_y - 9, 12, 10, parts[k]);
    p.text(x + 16, legend_y, names[k]);
    x += 16 + Picture::text_width(std::string(names[k]).size()) + 18;
  }
  if (!measured_s.empty()) {
    p.line({{x, legend_y - 10}, {x, legend_y + 2}}, ink, 2);
    p.text(x + 6, legend_y, "measured step (--validate)");
  }
  return p;
}

}  // namespace dtorch::plan
