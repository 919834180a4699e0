// Machine files (`dtorch plan --machine FILE`, what `dtorch plan calibrate` writes): the input
// is the file, read by read_machine, then every layout of gpt-debug on 4 ranks (2 nodes of 2
// when the file has inter-node links) is predicted as `dtorch plan` ranks them. A rate read
// without an error must give finite predictions: an inf or NaN step time or peak is a finding.
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "dtorch/plan/cost_model.h"
#include "dtorch/plan/machine.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(machine_file) {
  using namespace dtorch;
  static const std::string path = paths::join(fuzz::scratch(), "machine.json");
  static const plan::Workload workload = plan::workload_of("gpt-debug", 0, 8);
  fuzz::write_file(path, data, size);
  return fuzz::accept_errors([&] {
    plan::Machine m = plan::read_machine(path);
    m.ranks_per_node = m.inter_node.empty() ? 4 : 2;
    for (const plan::Prediction& p : plan::rank_layouts(workload, m, 4))
      if (!std::isfinite(p.step_s()) || !std::isfinite(p.peak_bytes) || p.step_s() < 0)
        throw std::logic_error("a machine file read without an error predicts a step of " +
                               std::to_string(p.step_s()) + " s and a peak of " +
                               std::to_string(p.peak_bytes) + " bytes");
  });
}
