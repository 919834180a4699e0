// Step measurements (step_stats.h).
#include "dtorch/train/step_stats.h"

#include <sstream>

#include "dtorch/report/metrics.h"

namespace dtorch::train {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string describe_phases(const std::map<std::string, double>& ms) {
  std::ostringstream os;
  os.precision(3);
  for (const char* phase : report::kStepPhases)
    if (auto it = ms.find(phase); it != ms.end()) os << ", " << phase << " " << it->second << " ms";
  return os.str();
}

}  // namespace dtorch::train
