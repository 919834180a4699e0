// `dtorch pipeline show`: a pipeline schedule's timeline as text (and PNG or SVG with --out), with
// its bubble and the activations each rank holds, computed by the on-paper simulator (Note
// [Schedules as data]).
#include <iomanip>
#include <iostream>
#include <sstream>

#include "dtorch/core/error.h"
#include "dtorch/core/picture.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/pp/schedule.h"
#include "dtorch/parallel/pp/stage_plan.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct PipelineFlags {
  pp::ScheduleKind schedule = pp::ScheduleKind::OneFOneB;
  int stages = 4;
  int microbatches = 8;
  int virtual_stages = 0;  // 0: the schedule's default
  std::string out;
  std::string model;  // also print how this model's units split into the stages
  std::string split;
};

/// The textbook bubble of each schedule with F = B = W = 1 time unit.
std::string formula(pp::ScheduleKind schedule, int p, int m, int v) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3);
  if (schedule == pp::ScheduleKind::Interleaved) {
    os << "(p-1)/(v m+p-1) = " << double(p - 1) / (v * m + p - 1);
  } else if (schedule == pp::ScheduleKind::ZeroBubble) {
    os << "(p-1)/(3m+p-1) = " << double(p - 1) / (3 * m + p - 1) << " for m >= p";
  } else {
    os << "(p-1)/(m+p-1) = " << double(p - 1) / (m + p - 1);
  }
  return os.str();
}

int run_show(const PipelineFlags& f) {
  const int v = f.virtual_stages > 0 ? f.virtual_stages : pp::default_virtual_stages(f.schedule);
  pp::Schedule s = pp::make_schedule(f.schedule, f.stages, f.microbatches, v);
  pp::Simulation sim = pp::simulate(s, f.microbatches);
  const std::string title =
      str(name_of(f.schedule), ", ", f.stages, " ranks", v > 1 ? str(" x ", v, " stages") : "",
          ", ", f.microbatches, " micro-batches");
  std::cout << title
            << " (forward 1 unit, backward 2 = input gradient 1 + weight gradient 1; F<m> "
               "forward, B<m> backward, I<m>/W<m> its input/weight halves, . idle"
            << (v > 1 ? "; a, b, ... the rank's first, second, ... stage" : "") << ")\n"
            << pp::timeline(s, sim) << std::fixed << std::setprecision(3)
            << "bubble (idle fraction per rank): " << sim.idle_fraction.front() << ", "
            << formula(f.schedule, f.stages, f.microbatches, v) << "\n"
            << "peak activations (stage micro-batches) per rank:";
  for (int a : sim.peak_activations)
    std::cout << " " << a;
  std::cout << "\n";
  if (!f.model.empty()) {
    std::vector<std::string> names;
    std::vector<int64_t> sizes;
    for (const auto& u : models::model_units(f.model)) {
      names.push_back(u.name);
      sizes.push_back(u.parameters);
    }
    std::cout << f.model << "'s pipeline units:";
    for (size_t i = 0; i < names.size(); ++i)
      std::cout << " " << i << " " << names[i] << (i + 1 < names.size() ? "," : "\n");
    const int stages = f.stages * v;
    pp::StagePlan plan = f.split.empty() ? pp::balance_stages(sizes, stages)
                                         : pp::split_stages_at(f.split, names, sizes, stages);
    std::cout << pp::describe(plan, names);
  }
  if (!f.out.empty()) {
    write_picture(pp::timeline_picture(s, sim, title), f.out);
    std::cout << "wrote " << f.out << "\n";
  }
  return 0;
}

}  // namespace

void add_pipeline_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<PipelineFlags>();
  auto* cmd = app.add_subcommand("pipeline", "Pipeline schedules: show one's timeline");
  cmd->require_subcommand(1);
  auto* show = cmd->add_subcommand("show", "Print a schedule's timeline, bubble and activations");
  add_choice_option(show, "--schedule", f->schedule, "gpipe | 1f1b | interleaved | zb (ZB-H1)");
  show->add_option("--stages", f->stages, "pipeline ranks")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  show->add_option("--microbatches", f->microbatches)
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  show->add_option("--virtual-stages", f->virtual_stages,
                   "stages per rank for interleaved (default 2)")
      ->check(CLI::Range(1, 16));
  show->add_option("--out", f->out, "also draw the timeline into this .png or .svg file");
  show->add_option("--model", f->model,
                   "also list this model's units and the stages they balance into");
  show->add_option("--pp-split", f->split, "with --model: cut at these units instead");
  show->callback([f, &exit_code] { exit_code = run_show(*f); });
}

}  // namespace dtorch::tools
