// Communicator shared-memory set-up: when every rank of a communicator runs on one node, its
// ranks agree on a segment and use it for their allreduce, reduce-scatter and allgather (Note
// [Shared-memory allreduce] in shm_allreduce.cpp).
#include <unistd.h>

#include <random>

#include "dtorch/comm/communicator.h"
#include "dtorch/comm/communicator_internal.h"
#include "dtorch/core/env.h"
#include "dtorch/core/log.h"

namespace dtorch::comm {
namespace {

// Whether every rank of the job is on this node and the shared-memory path may be used
// (DTORCH_SHM=0 turns it off).
bool single_node_shm_wanted(const launch::RankInfo& info) {
  return info.world_size > 1 && info.local_world_size == info.world_size &&
         env::get("DTORCH_SHM").value_or("1") != "0";
}

}  // namespace

void Communicator::setup_shared_memory() {
  Impl& m = *impl_;
  if (!single_node_shm_wanted(info_) || !m.gloo) return;
  std::string why, name;
  try {
    if (rank() == 0) {
      name = str("/dtorch-", getpid(), "-", info_.restart_count, "-", std::random_device{}());
      m.store->set("shm/name", std::vector<uint8_t>(name.begin(), name.end()));
    } else {
      auto v = m.store->get("shm/name");
      name.assign(v.begin(), v.end());
    }
  } catch (const std::exception& e) {
    // Rank 0 posts the name as soon as its group exists: one that has not within DTORCH_TIMEOUT
    // is gone or stalled, and the agreement below would wait as long again (a rank stopped
    // here ended the job after twice the timeout).
    fail("store get (rank 0's shared-memory segment name)", 0, e.what(), -1);
  }
  try {
    m.shm = std::make_unique<ShmAllreduce>(name, rank(), size(), opts_.timeout);
  } catch (const std::exception& e) {
    why = first_line(e.what());
  }
  // All ranks must take the same path, or their collectives would never meet.
  at::Tensor ok = at::full({1}, why.empty() ? 1 : 0, at::kInt);
  std::vector<at::Tensor> v{ok};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MIN;
  try {
    m.gloo->allreduce(v, o)->wait(opts_.timeout);
  } catch (const std::exception& e) {
    // Unnumbered (sequence 0): the user's first collective stays #1. Note [Failure diagnosis]
    fail(str("allreduce (whether every rank can use shared memory, ", detail::describe(ok), ")"), 0,
         e.what(), -1);
  }
  if (ok.item<int>() == 1) return;
  m.shm.reset();
  if (!why.empty()) log::warn("shared-memory allreduce unavailable (", why, "); using Gloo");
}

}  // namespace dtorch::comm
