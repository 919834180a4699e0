// The top layouts of a plan as a picture, in the style of `dtorch plot` and `dtorch pipeline
// show --out`: one bar per layout, its predicted step split into compute, exposed
// communication and bubble, and where --validate ran it, a mark at the measured step.
#pragma once

#include <string>
#include <vector>

#include "dtorch/core/picture.h"
#include "dtorch/plan/cost_model.h"

namespace dtorch::plan {

/// `rows` in their order; `measured_s[i]` the measured step of rows[i], or 0 when not run
/// (may be shorter than rows).
Picture plan_picture(const std::vector<Prediction>& rows, const std::vector<double>& measured_s,
                     const Workload& w, const std::string& title);

}  // namespace dtorch::plan
