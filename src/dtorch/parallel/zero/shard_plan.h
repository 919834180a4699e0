// Shard planning for ZeRO / FSDP: which parameters share a flat buffer (a unit), and which
// slice of every unit each rank owns. Pure functions, unit-tested without any process group.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtorch::zero {

// Note [Flat units]
// Parameters are packed, in registration order, into flat 1-D buffers called units. A unit's
// length is padded up to a multiple of the world size so that every rank owns exactly
// `shard` consecutive elements: rank r owns [r*shard, (r+1)*shard). Padding elements are
// zero, get zero gradients, and so stay zero under SGD and AdamW: they never change results.
// zero-1/2 units are size-capped buckets; zero-3 units follow the model's blocks (transformer
// blocks, ResNet stages) because a unit is gathered right before its first block runs and
// released after its last; parameters outside every block form the "root" unit, which stays
// gathered (FSDP keeps its root unit gathered between forward and backward too).

/// What the planner needs to know about one parameter.
struct ParamInfo {
  std::string name;  ///< dotted name, as named_parameters() gives it
  int64_t numel = 0;
};

/// Parameters (indices into the list given to make_plan) and blocks of one unit.
struct UnitSpec {
  std::string name;
  std::vector<size_t> params;
  /// Module paths of the blocks whose forward this unit's parameters serve, in forward
  /// order; empty for size-capped buckets and the root unit.
  std::vector<std::string> blocks;
};

struct UnitEntry {
  size_t param = 0;    ///< index into the parameter list
  int64_t offset = 0;  ///< element offset in the unit's flat buffer
  int64_t numel = 0;
};

struct Unit {
  std::string name;
  std::vector<UnitEntry> entries;
  std::vector<std::string> blocks;
  int64_t numel = 0;   ///< elements of real parameters
  int64_t padded = 0;  ///< numel rounded up to a multiple of the world size
  int64_t shard = 0;   ///< padded / world: elements each rank owns
  /// The real (not padding) elements in rank r's shard, as [begin, end) in unit coordinates;
  /// begin == end when r's shard is all padding.
  std::pair<int64_t, int64_t> owned(int rank) const;
};

struct ShardPlan {
  int world = 1;
  std::vector<Unit> units;  ///< in forward order
  /// For each parameter: its unit and its entry within that unit.
  std::vector<std::pair<size_t, size_t>> where;
};

/// zero-1/2 units: consecutive parameters, a unit closing before the parameter that would take
/// it over `cap_numel` elements (DeepSpeed's reduce_bucket_size); a parameter larger than the
/// cap gets a unit of its own. Note [Gradient buckets of stage 2]: the cap keeps every bucket
/// of several parameters in the heap.
std::vector<UnitSpec> units_by_size(const std::vector<ParamInfo>& params, int64_t cap_numel);

/// zero-3 units (the wrap policy): unit 0 is "root" (the parameters outside every block; it
/// may be empty), then consecutive blocks merged until a unit holds at least `min_params`
/// elements (0: one unit per block). A parameter belongs to block B when its name starts
/// with "B.". Throws ConfigError when a block owns no parameter or a parameter would belong
/// to two blocks.
std::vector<UnitSpec> units_by_blocks(const std::vector<ParamInfo>& params,
                                      const std::vector<std::string>& blocks, int64_t min_params);

/// Lays out every unit for `world` ranks (Note [Flat units]). Each parameter must be in
/// exactly one unit (else ConfigError naming it).
ShardPlan make_plan(const std::vector<ParamInfo>& params, const std::vector<UnitSpec>& units,
                    int world);

}  // namespace dtorch::zero
