// The checks every model's tensor-parallel plan makes, and the module-path patterns its rules
// (and unit policies) use (tensor_plan.h).
#include "dtorch/models/tensor_plan.h"

#include "dtorch/core/error.h"

namespace dtorch::models {

void check_tensor_split(int tp, int64_t n, const std::string& what, const std::string& model) {
  DTORCH_CHECK_T(ConfigError, n % tp == 0, "tensor parallelism over ", tp, " ranks splits the ",
                 what, " of ", model, " (", n, ") ", tp, " ways: choose a tp that divides ", n);
}

bool module_path_matches(const std::string& pattern, const std::string& path) {
  size_t p = 0, q = 0;
  while (p <= pattern.size() && q <= path.size()) {
    size_t pe = pattern.find('.', p), qe = path.find('.', q);
    if (pe == std::string::npos) pe = pattern.size();
    if (qe == std::string::npos) qe = path.size();
    std::string a = pattern.substr(p, pe - p), b = path.substr(q, qe - q);
    if (a != "*" && a != b) return false;
    if (a == "*" && b.empty()) return false;
    const bool pattern_done = pe == pattern.size(), path_done = qe == path.size();
    if (pattern_done || path_done) return pattern_done && path_done;
    p = pe + 1;
    q = qe + 1;
  }
  return false;
}

}  // namespace dtorch::models
