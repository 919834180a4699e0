// Shard planning for ZeRO / FSDP (see shard_plan.h).
#include "dtorch/parallel/zero/shard_plan.h"

#include <algorithm>

#include "dtorch/core/error.h"

namespace dtorch::zero {

std::pair<int64_t, int64_t> Unit::owned(int rank) const {
  int64_t begin = std::min(numel, rank * shard);
  return {begin, std::min(numel, begin + shard)};
}

std::vector<UnitSpec> units_by_size(const std::vector<ParamInfo>& params, int64_t cap_numel) {
  DTORCH_CHECK_T(ConfigError, cap_numel > 0, "the bucket size must be positive");
  std::vector<UnitSpec> units;
  int64_t filled = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (units.empty() || filled + params[i].numel > cap_numel) {
      units.push_back({str("bucket", units.size()), {}, {}});
      filled = 0;
    }
    units.back().params.push_back(i);
    filled += params[i].numel;
  }
  return units;
}

std::vector<UnitSpec> units_by_blocks(const std::vector<ParamInfo>& params,
                                      const std::vector<std::string>& blocks, int64_t min_params) {
  std::vector<int> owner(params.size(), -1);
  std::vector<int64_t> block_numel(blocks.size(), 0);
  for (size_t b = 0; b < blocks.size(); ++b) {
    const std::string prefix = blocks[b] + ".";
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].name.rfind(prefix, 0) != 0) continue;
      DTORCH_CHECK_T(ConfigError, owner[i] < 0, "parameter ", params[i].name,
                     " belongs to two blocks, ", blocks[owner[i]], " and ", blocks[b],
                     "; block names must not nest");
      owner[i] = static_cast<int>(b);
      block_numel[b] += params[i].numel;
    }
    DTORCH_CHECK_T(ConfigError, block_numel[b] > 0, "block ", blocks[b],
                   " owns no parameter (is it a module path from named_modules()?)");
  }
  std::vector<UnitSpec> units{{"root", {}, {}}};
  for (size_t i = 0; i < params.size(); ++i) {
    if (owner[i] < 0) units[0].params.push_back(i);
  }
  int64_t filled = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (units.size() == 1 || filled >= min_params) {
      units.push_back({blocks[b], {}, {}});
      filled = 0;
    }
    units.back().blocks.push_back(blocks[b]);
    for (size_t i = 0; i < params.size(); ++i) {
      if (owner[i] == static_cast<int>(b)) units.back().params.push_back(i);
    }
    filled += block_numel[b];
  }
  return units;
}

ShardPlan make_plan(const std::vector<ParamInfo>& params, const std::vector<UnitSpec>& units,
                    int world) {
  DTORCH_CHECK_T(ConfigError, world >= 1, "world size must be >= 1");
  ShardPlan plan;
  plan.world = world;
  plan.where.assign(params.size(), {SIZE_MAX, 0});
  for (size_t u = 0; u < units.size(); ++u) {
    Unit unit;
    unit.name = units[u].name;
    unit.blocks = units[u].blocks;
    for (size_t i : units[u].params) {
      DTORCH_CHECK_T(ConfigError, i < params.size(), "unit ", unit.name, " names parameter index ",
                     i, " of ", params.size());
      DTORCH_CHECK_T(ConfigError, plan.where[i].first == SIZE_MAX, "parameter ", params[i].name,
                     " is in two units");
      plan.where[i] = {u, unit.entries.size()};
      unit.entries.push_back({i, unit.numel, params[i].numel});
      unit.numel += params[i].numel;
    }
    unit.shard = (unit.numel + world - 1) / world;
    unit.padded = unit.shard * world;
    plan.units.push_back(std::move(unit));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    DTORCH_CHECK_T(ConfigError, plan.where[i].first != SIZE_MAX, "parameter ", params[i].name,
                   " is in no unit");
  }
  return plan;
}

}  // namespace dtorch::zero
