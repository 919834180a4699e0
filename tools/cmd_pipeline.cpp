// `dtorch pipeline show`: a pipeline schedule's timeline as text, with its bubble and the
// activations each stage holds, computed by the on-paper simulator (Note [Schedules as data]).
#include <iomanip>
#include <iostream>

#include "dtorch/parallel/pipeline/schedule.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct PipelineFlags {
  std::string schedule = "1f1b";
  int stages = 4;
  int microbatches = 8;
};

int run_show(const PipelineFlags& f) {
  pp::Schedule s = f.schedule == "gpipe" ? pp::gpipe(f.stages, f.microbatches)
                                         : pp::one_f_one_b(f.stages, f.microbatches);
  pp::Simulation sim = pp::simulate(s, f.microbatches);
  std::cout << f.schedule << ", " << f.stages << " stages, " << f.microbatches
            << " micro-batches (forward 1 unit, backward 2; F<m> forward, B<m> backward, . idle)\n"
            << pp::timeline(s, sim) << std::fixed << std::setprecision(3)
            << "bubble (idle fraction per rank): " << sim.idle_fraction.front()
            << ", (p-1)/(m+p-1) = " << double(f.stages - 1) / double(f.microbatches + f.stages - 1)
            << "\n"
            << "peak activations (micro-batches) per rank:";
  for (int a : sim.peak_activations)
    std::cout << " " << a;
  std::cout << "\n";
  return 0;
}

}  // namespace

void add_pipeline_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<PipelineFlags>();
  auto* cmd = app.add_subcommand("pipeline", "Pipeline schedules: show one's timeline");
  cmd->require_subcommand(1);
  auto* show = cmd->add_subcommand("show", "Print a schedule's timeline, bubble and activations");
  show->add_option("--schedule", f->schedule, "gpipe | 1f1b")
      ->check(CLI::IsMember({"gpipe", "1f1b"}))
      ->capture_default_str();
  show->add_option("--stages", f->stages)->check(CLI::Range(1, 64))->capture_default_str();
  show->add_option("--microbatches", f->microbatches)
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  show->callback([f, &exit_code] { exit_code = run_show(*f); });
}

}  // namespace dtorch::tools
