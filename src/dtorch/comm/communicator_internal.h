// What the Communicator's source files share: its state (Communicator::Impl) and the helpers
// more than one of them uses. communicator.cpp connects (rendezvous, process groups),
// communicator_diagnosis.cpp explains failures, communicator_shm.cpp sets up shared memory and
// communicator_collectives.cpp issues the collectives.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dtorch/comm/backend_compat.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/comm/shm_allreduce.h"
#include "dtorch/core/error.h"
#include "dtorch/core/ordered_thread.h"

namespace dtorch::comm {

struct Communicator::Impl {
  c10::intrusive_ptr<c10d::Store> root_store;  // the TCPStore (or a HashStore alone)
  c10::intrusive_ptr<c10d::Store> store;       // namespaced to this restart attempt
  bool store_silent = false;  // a failure's diagnosis found it not answering: given up
  c10::intrusive_ptr<Backend> gloo;
  c10::intrusive_ptr<Backend> nccl;
  std::unique_ptr<ShmAllreduce> shm;      // Note [Shared-memory allreduce], single node only
  std::unique_ptr<OrderedThread> worker;  // multi-step collectives, in issue order
  std::mutex mu;  // collectives must be issued in one order; hooks may race to issue them
  long seq = 0;
  Traffic traffic;                    // guarded by mu
  std::vector<int> global_ranks;      // job-wide rank of each of this communicator's ranks
  std::string group_name;             // empty for the whole job
  std::map<std::string, int> splits;  // how often each group was split off here (under mu)
  std::vector<int> nodes;             // each rank's node_rank, from its rendezvous entry

  Backend& backend_for(const at::Tensor& t) {
    if (t.is_cuda()) {
      DTORCH_CHECK_T(CommError, nccl, "a CUDA tensor was passed to a collective, but this ",
                     "dtorch has no NCCL backend (built against a LibTorch without CUDA/NCCL, ",
                     "or DTORCH_BACKEND=gloo); move the tensor to the CPU or rebuild dtorch "
                     "against a CUDA LibTorch");
      return *nccl;
    }
    DTORCH_CHECK_T(CommError, gloo, "a CPU tensor was passed to a collective, but only the NCCL ",
                   "backend was created (DTORCH_BACKEND=nccl); use DTORCH_BACKEND=auto");
    return *gloo;
  }
};

namespace detail {

// How long the first post of a failure's diagnosis may take (Note [Failure diagnosis] in
// communicator_diagnosis.cpp).
constexpr std::chrono::milliseconds kStoreAnswers{2000};

// What a rank announces at the rendezvous, "<host> pid <pid> node <node_rank>": where its process
// runs, for a diagnosis, and its node, for node_of.
struct RendezvousEntry {
  std::string host;
  pid_t pid = 0;
  int node = 0;
};

// std::nullopt for an entry not of that form (communicator.cpp).
std::optional<RendezvousEntry> parse_entry(const std::string& text);

// The ranks that had not posted their Gloo address to the store when creating the process group
// failed, each with what this host knows of its process ("0 (stopped: SIGSTOP or ^Z)"); empty
// when the store cannot tell. Gloo's key for rank R's address under the job's store is
// "gloo/0/rank_R" in LibTorch 1.13 and "gloo/0/R" in 2.x: the one that holds this rank's own
// address, which it posted before it waited for the others, is the one to look at
// (communicator_diagnosis.cpp).
std::string missing_from_gloo(c10d::Store& store, int rank, int world,
                              const std::function<std::string(int)>& name);

// "a, b, c" (communicator.cpp).
std::string join(const std::vector<std::string>& v);

// "<numel> x <dtype>, <size> MiB", for an operation's name in errors and traces
// (communicator_collectives.cpp).
std::string describe(const at::Tensor& t);

}  // namespace detail
}  // namespace dtorch::comm
