// The rendezvous store (c10d::TCPStore): served by the launcher or by rank 0, and joined by
// every rank. Small key/value exchange only; tensors travel through the Communicator.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/version.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace dtorch::launch {

/// Whether this LibTorch can serve a TCPStore with libuv (Note [TCPStore backend]).
constexpr bool kStoreHasLibuv = TORCH_VERSION_MAJOR > 2 ||
                                (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4);

/// Serves a store on `listen`:port for `world_size` clients: port 0 picks a free one (see
/// served_port), `listen` "" means every interface (Note [Where the store listens]). Throws
/// CommError naming the port when it is already in use.
c10::intrusive_ptr<c10d::Store> serve_store(int port, int world_size,
                                            std::chrono::milliseconds timeout,
                                            const std::string& listen = "127.0.0.1");

/// The port a store made by serve_store listens on.
int served_port(const c10::intrusive_ptr<c10d::Store>& store);

/// Whether a store made by serve_store runs on libuv (Note [TCPStore backend]); false on
/// LibTorch 1.13 and where the LibTorch lacks libuv or USE_LIBUV=0.
bool served_by_libuv(const c10::intrusive_ptr<c10d::Store>& store);

/// A TCP port that was free a moment ago (bound to port 0 and released), as torchrun picks the
/// workers' MASTER_PORT. Throws CommError when no socket can be bound.
int free_port();

/// Connects to a store served elsewhere; throws CommError naming addr:port when it cannot be
/// reached within `timeout`.
c10::intrusive_ptr<c10d::Store> connect_store(const std::string& addr, int port,
                                              std::chrono::milliseconds timeout);

/// Note [One job per store]
/// A store belongs to one job: the launcher that serves it, or the first launcher to reach it,
/// claims it for the job's run id (--rdzv-id, TORCHELASTIC_RUN_ID to the workers) under the key
/// "dtorch/job". A launcher of another job that reaches it (another job given the same port, a
/// stale launcher from an earlier job) is refused, naming both ids, before it writes any of the
/// job's keys; so is a dtorch worker whose TORCHELASTIC_RUN_ID is another job's. A store nobody
/// claimed (served by PyTorch's torchrun, or by rank 0) is joined as before.

/// Claims `store`, reached at `where` ("host:port"), for job `run_id`, or checks that job
/// `run_id` holds it; CommError naming both jobs when another does.
void claim_store_for_job(c10d::Store& store, const std::string& run_id, const std::string& where);

/// For a worker: CommError when `store` was claimed by a job other than `run_id`.
void check_store_job(c10d::Store& store, const std::string& run_id, const std::string& where);

/// The whole number a process of the job wrote into a store under `key`, from `value` as read.
/// Throws CommError naming the key and the value (at most 40 bytes of it) when it is none:
/// something other than the job's processes wrote it.
int64_t number_in_store(const std::string& value, const std::string& key);

/// Who had arrived when announce_and_wait returned: values[i] is what party i announced, ""
/// for a party that had not.
struct Arrivals {
  std::vector<std::string> values;
  std::vector<int> missing() const;
  bool complete() const { return missing().empty(); }
};

/// What a long wait says while it goes on: `say(arrivals, seconds waited)` after `after` and
/// then every `after` again, until the wait ends.
struct WaitNotice {
  std::chrono::milliseconds after{10000};
  std::function<void(const Arrivals&, double seconds)> say;
};

/// Note [Announce and wait]: the one way the parties of a job meet in a store, launchers
/// (a static job's rounds, launch/elastic_rendezvous.h) and workers (comm::Communicator) alike.
/// Party `self` sets "<prefix><self>" to `value` (which names it; self < 0 announces nothing), then
/// every party's key is polled until all `count` have arrived or `deadline` passes. `arrivals` is
/// filled as parties are seen, so that it says who is missing for the caller's message, also when
/// the store goes away (the call then throws what the store threw). Returns whether all arrived. A
/// wait is never silent: `notice` says what it waits for after 10 s and every 10 s after.
bool announce_and_wait(c10d::Store& store, const std::string& prefix, int self,
                       const std::string& value, int count,
                       std::chrono::steady_clock::time_point deadline, Arrivals& arrivals,
                       const WaitNotice& notice = {});

}  // namespace dtorch::launch
