// torchrun's environment (also what `dtorch launch` sets) -> Detected, with every inconsistency
// reported by variable name.
#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/launch/detect.h"

namespace dtorch::launch {

std::optional<Detected> detect_torchrun() {
  auto rank = env::get_int("RANK");
  auto world = env::get_int("WORLD_SIZE");
  // WORLD_SIZE alone is judged against the scheduler (Note [Launch environment precedence]).
  if (!rank) return std::nullopt;
  DTORCH_CHECK_T(ConfigError, world, "RANK and WORLD_SIZE must be set together (RANK=", *rank,
                 ", WORLD_SIZE=-1); start the program with `dtorch launch` or torchrun, or unset "
                 "both");
  DTORCH_CHECK_T(ConfigError, *world >= 1 && *rank >= 0 && *rank < *world, "RANK=", *rank,
                 " is not within WORLD_SIZE=", *world, " (ranks are 0..WORLD_SIZE-1)");
  Detected d;
  d.source = "torchrun variables";
  d.rank_var = "RANK";
  d.world_var = "WORLD_SIZE";
  RankInfo& r = d.info;
  r.rank = static_cast<int>(*rank);
  r.world_size = static_cast<int>(*world);
  r.local_rank = static_cast<int>(env::get_int("LOCAL_RANK").value_or(r.rank));
  r.local_world_size = static_cast<int>(env::get_int("LOCAL_WORLD_SIZE").value_or(r.world_size));
  DTORCH_CHECK_T(ConfigError,
                 r.local_world_size >= 1 && r.local_rank >= 0 &&
                     r.local_rank < r.local_world_size && r.local_world_size <= r.world_size,
                 "LOCAL_RANK=", r.local_rank, " and LOCAL_WORLD_SIZE=", r.local_world_size,
                 " do not fit WORLD_SIZE=", r.world_size);
  r.nnodes = (r.world_size + r.local_world_size - 1) / r.local_world_size;
  r.node_rank = static_cast<int>(env::get_int("GROUP_RANK").value_or(r.rank / r.local_world_size));
  const MasterEnv master = master_from_env();
  r.master_addr = master.addr.value_or("127.0.0.1");
  if (master.port) {
    r.master_port = *master.port;
  } else {
    DTORCH_CHECK_T(ConfigError, r.world_size == 1,
                   "MASTER_PORT is not set but WORLD_SIZE=", r.world_size,
                   "; set MASTER_ADDR and MASTER_PORT, or use `dtorch launch`");
  }
  r.restart_count = static_cast<int>(env::get_int("TORCHELASTIC_RESTART_COUNT").value_or(0));
  r.launcher_hosts_store = env::get("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  r.run_id = env::get("TORCHELASTIC_RUN_ID").value_or("");
  d.set_by_launcher = env::get("TORCHELASTIC_RUN_ID") || env::get("GROUP_RANK");
  return d;
}

}  // namespace dtorch::launch
