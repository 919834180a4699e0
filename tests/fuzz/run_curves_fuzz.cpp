// A run's metrics.jsonl as `dtorch plot RUN...` reads it: the input is the file's text, parsed
// into curves and drawn.
#include <cstdint>
#include <string>

#include "dtorch/report/curves.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(run_curves) {
  using namespace dtorch;
  const std::string text(reinterpret_cast<const char*>(data), size);
  return fuzz::accept_errors([&] {
    report::RunCurves curves = report::parse_run_curves(text, "metrics.jsonl", "run");
    (void)report::draw_curves({curves}, "fuzz");
  });
}
