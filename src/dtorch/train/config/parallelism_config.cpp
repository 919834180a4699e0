// The parallelism's settings (parallelism_config.h): the data-parallel degree they leave and
// their validation.
#include "dtorch/train/config/parallelism_config.h"

#include <algorithm>

#include "dtorch/core/error.h"
#include "dtorch/parallel/replicas.h"

namespace dtorch::train {
inline namespace config {

int data_parallel_size(const ParallelismConfig& c, int world_size) {
  return std::max(1, world_size / std::max(1, c.tp * c.cp * c.pp));
}

void validate(const ParallelismConfig& c) {
  DTORCH_CHECK_T(ConfigError, c.tp >= 1, "--tp must be >= 1 (got ", c.tp, ")");
  DTORCH_CHECK_T(ConfigError, c.tp > 1 || !c.sequence_parallel,
                 "--sequence-parallel splits the sequence across tensor-parallel ranks: it needs "
                 "--tp 2 or more");
  DTORCH_CHECK_T(ConfigError, c.pp >= 1, "--pp must be >= 1 (got ", c.pp, ")");
  DTORCH_CHECK_T(ConfigError, c.cp >= 1, "--cp must be >= 1 (got ", c.cp, ")");
  DTORCH_CHECK_T(ConfigError, c.cp == 1 || c.pp == 1, "--cp ", c.cp, " with --pp ", c.pp,
                 ": context parallelism does not run under a pipeline yet; use one of the two");
  DTORCH_CHECK_T(ConfigError, c.cp > 1 || c.cp_kind == cp::Kind::Ring,
                 "--cp-kind applies to context parallelism: add --cp N (N >= 2)");
  if (c.pp > 1) {
    DTORCH_CHECK_T(ConfigError, c.microbatches >= 0,
                   "--microbatches must be >= 1, or 0 for 2 x --pp");
  } else {
    DTORCH_CHECK_T(ConfigError, c.microbatches == 0 && c.pp_split.empty(),
                   "--microbatches and --pp-split apply to pipelines: add --pp N (N >= 2)");
  }
  DTORCH_CHECK_T(ConfigError, c.dp_replicate >= 0, "--dp-replicate ", c.dp_replicate,
                 ": give the number of replicas (1: plain ZeRO), or auto for one a node");
  DTORCH_CHECK_T(ConfigError, c.activation_checkpointing >= 0, "--activation-checkpointing ",
                 c.activation_checkpointing,
                 ": give K >= 1 to recompute every K-th block (1: every block)");
}

ParallelismConfig resolve_replicas(ParallelismConfig c, int world_size, int ranks_per_node) {
  const bool automatic = c.dp_replicate == 0;
  if (automatic) c.dp_replicate = parallel::replicas_a_node(world_size, c.pp, ranks_per_node);
  DTORCH_CHECK_T(ConfigError, c.dp_replicate <= world_size, "--dp-replicate ", c.dp_replicate,
                 " is more replicas than the job's ", world_size, " ranks");
  const int dp = data_parallel_size(c, world_size);
  DTORCH_CHECK_T(
      ConfigError, dp % c.dp_replicate == 0, "--dp-replicate ",
      automatic ? str("auto (", c.dp_replicate, ", one replica a node)") : str(c.dp_replicate),
      " does not divide the ", dp,
      " data-parallel ranks into replicas of equal size: ", "give a divisor of ", dp);
  return c;
}

}  // namespace config
}  // namespace dtorch::train
