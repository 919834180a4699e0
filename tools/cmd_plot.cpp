// `dtorch plot RUN_DIR [RUN_DIR...] --out FILE.png|svg`: the training curves of one or more
// `dtorch train` runs from their metrics.jsonl, overlaid in one picture (report/curves.h).
#include <iostream>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/report/curves.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct PlotFlags {
  std::vector<std::string> runs;
  std::vector<std::string> labels;
  std::string out;
  std::string title = "dtorch train";
};

int run_plot(const PlotFlags& f) {
  DTORCH_CHECK_T(ConfigError, f.labels.empty() || f.labels.size() == f.runs.size(), "--label ",
                 "was given ", f.labels.size(), " time(s) for ", f.runs.size(),
                 " run folder(s): give one per run, in the same order, or none");
  std::vector<report::RunCurves> curves;
  for (size_t i = 0; i < f.runs.size(); ++i) {
    const std::string label = f.labels.empty() ? paths::lexically_normal(f.runs[i]) : f.labels[i];
    curves.push_back(report::read_run_curves(f.runs[i], label));
  }
  write_picture(report::draw_curves(curves, f.title), f.out);
  std::cout << "wrote " << f.out << " (" << curves.size() << " run(s))" << std::endl;
  return 0;
}

}  // namespace

void add_plot_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<PlotFlags>();
  auto* cmd = app.add_subcommand(
      "plot",
      "Draw the training curves of dtorch train runs (losses, test accuracy, samples/s, learning "
      "rate, step phases) from their metrics.jsonl, several runs overlaid");
  cmd->add_option("runs", f->runs, "the --out folders of dtorch train runs")->required();
  cmd->add_option("--out", f->out, "the picture: FILE.png or FILE.svg")->required();
  cmd->add_option("--label", f->labels,
                  "a run's name in the legend (once per run, in order; "
                  "default: its folder)");
  cmd->add_option("--title", f->title, "the picture's title")->capture_default_str();
  cmd->callback([f, &exit_code] { exit_code = run_plot(*f); });
}

}  // namespace dtorch::tools
