// Which pipeline units each stage holds: balanced by parameter count, or cut where the user
// says (--pp-split). Pure, so it is tested without processes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtorch/models/model.h"

namespace dtorch::pp {

/// Stage s holds units [stages[s].begin, stages[s].end).
struct StagePlan {
  std::vector<models::UnitRange> stages;
  /// Parameters per stage (as the unit sizes given).
  std::vector<int64_t> parameters;
};

/// Cuts `unit_sizes` (parameters per unit, in forward order) into `stages` contiguous,
/// non-empty ranges so that the largest stage is as small as possible (ties: the earliest
/// cuts). ConfigError when there are fewer units than stages.
StagePlan balance_stages(const std::vector<int64_t>& unit_sizes, int stages);

/// The plan whose stages 1..n-1 begin at the units named in `split` (comma-separated unit
/// names or indices, e.g. "transformer.h.2,head" or "3,5"), n = stages. ConfigError naming
/// the bad entry and the units there are, when a name is unknown, the cuts are not
/// increasing, or there are not stages - 1 of them.
StagePlan split_stages_at(const std::string& split, const std::vector<std::string>& unit_names,
                          const std::vector<int64_t>& unit_sizes, int stages);

/// "stage 0: embedding .. transformer.h.1 (1.2 M parameters)" per line.
std::string describe(const StagePlan& plan, const std::vector<std::string>& unit_names);

}  // namespace dtorch::pp
