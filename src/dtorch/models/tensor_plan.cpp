// The check every model's tensor-parallel plan makes (tensor_plan.h).
#include "dtorch/models/tensor_plan.h"

#include "dtorch/core/error.h"

namespace dtorch::models {

void check_tensor_split(int tp, int64_t n, const std::string& what, const std::string& model) {
  DTORCH_CHECK_T(ConfigError, n % tp == 0, "tensor parallelism over ", tp, " ranks splits the ",
                 what, " of ", model, " (", n, ") ", tp, " ways: choose a tp that divides ", n);
}

}  // namespace dtorch::models
