// Stage planning: the linear-partition dynamic program and --pp-split parsing.
#include "dtorch/parallel/pp/stage_plan.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "dtorch/core/error.h"

namespace dtorch::pp {
namespace {

StagePlan from_starts(const std::vector<int>& starts, const std::vector<int64_t>& sizes) {
  StagePlan plan;
  for (size_t s = 0; s < starts.size(); ++s) {
    const int end = s + 1 < starts.size() ? starts[s + 1] : static_cast<int>(sizes.size());
    plan.stages.push_back({starts[s], end});
    int64_t total = 0;
    for (int u = starts[s]; u < end; ++u)
      total += sizes[u];
    plan.parameters.push_back(total);
  }
  return plan;
}

void check_count(size_t units, int stages) {
  DTORCH_CHECK_T(ConfigError, stages >= 1 && static_cast<size_t>(stages) <= units, "the model has ",
                 units, " pipeline units, so it splits into 1 to ", units, " stages, not ", stages,
                 ": lower --pp (times --virtual-stages)");
}

}  // namespace

StagePlan balance_stages(const std::vector<int64_t>& sizes, int stages) {
  check_count(sizes.size(), stages);
  const int n = static_cast<int>(sizes.size());
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + sizes[i];
  // best[k][i]: the smallest largest stage when the first i units form k stages.
  const int64_t inf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == inf) continue;
        const int64_t worst = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (worst < best[k][i]) {
          best[k][i] = worst;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int> starts(stages);
  for (int k = stages, i = n; k >= 1; --k) {
    starts[k - 1] = cut[k][i];
    i = cut[k][i];
  }
  return from_starts(starts, sizes);
}

StagePlan split_stages_at(const std::string& split, const std::vector<std::string>& names,
                          const std::vector<int64_t>& sizes, int stages) {
  check_count(sizes.size(), stages);
  std::string known;
  for (size_t i = 0; i < names.size(); ++i)
    known += str(i ? ", " : "", i, " ", names[i]);
  std::vector<int> starts = {0};
  std::stringstream in(split);
  for (std::string item; std::getline(in, item, ',');) {
    int unit = -1;
    auto it = std::find(names.begin(), names.end(), item);
    if (it != names.end()) {
      unit = static_cast<int>(it - names.begin());
    } else if (!item.empty() && item.find_first_not_of("0123456789") == std::string::npos) {
      unit = std::stoi(item);
    }
    DTORCH_CHECK_T(ConfigError, unit > 0 && unit < static_cast<int>(names.size()), "--pp-split: '",
                   item, "' is not a unit a stage after the first can begin ", "at; the units are ",
                   known);
    DTORCH_CHECK_T(ConfigError, unit > starts.back(), "--pp-split: '", item,
                   "' does not come after the previous cut; list the cuts in forward order");
    starts.push_back(unit);
  }
  DTORCH_CHECK_T(ConfigError, static_cast<int>(starts.size()) == stages, "--pp-split '", split,
                 "' cuts the model into ", starts.size(), " stages but the pipeline has ", stages,
                 ": give ", stages - 1, " cut(s)");
  return from_starts(starts, sizes);
}

std::string describe(const StagePlan& plan, const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const auto& r = plan.stages[s];
    os << "stage " << s << ": " << names[r.begin];
    if (r.end - r.begin > 1) os << " .. " << names[r.end - 1];
    os << " (" << plan.parameters[s] << " parameters)\n";
  }
  return os.str();
}

}  // namespace dtorch::pp
