// Checkpoint on a signal (Note [Checkpoint on a signal]): the handler, and the agreement on a
// step through the job's store.
#include "dtorch/train/preemption.h"

#include <signal.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/launch/store.h"

namespace dtorch::train {
namespace {

using Clock = std::chrono::steady_clock;

// How often a rank that did not get the signal looks for a proposal, at most.
constexpr double kLookEvery = 0.5;
const std::string kStopKey = "dtorch/checkpoint-signal/stop-after";

std::atomic<bool> g_signalled{false};
struct sigaction g_previous;
// The signal catch_checkpoint_signal caught for the whole process (0: none).
std::atomic<int> g_caught_for_process{0};

void on_signal(int) {
  g_signalled.store(true);
}

void install(int sig, struct sigaction* previous) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(sig, &sa, previous);
}

int64_t parse_step(const std::vector<uint8_t>& bytes) {
  const int64_t step = launch::number_in_store(std::string(bytes.begin(), bytes.end()), kStopKey);
  DTORCH_CHECK_T(CommError, step > 0, "the rendezvous store holds step ", step, " under ", kStopKey,
                 ": something other than this job's ranks wrote it");
  return step;
}

}  // namespace

int64_t proposed_stop(int64_t step, double step_seconds, double look_every) {
  // The others may be one step further; each looks within two looks and a step of hearing.
  const double two_looks = std::ceil(2 * look_every / std::max(step_seconds, 1e-6));
  return step + 1 + static_cast<int64_t>(std::min(two_looks, 1e6)) + 1;
}

void catch_checkpoint_signal(launch::CheckpointSignal signal) {
  const int sig = launch::signal_number(signal);
  if (sig == 0) return;
  install(sig, nullptr);
  g_caught_for_process = sig;
}

Preemption::Preemption(launch::CheckpointSignal signal, c10d::Store& store, int rank)
    : signal_(signal), store_(store), rank_(rank), last_look_(Clock::now()) {
  const int sig = launch::signal_number(signal_);
  if (sig == 0 || sig == g_caught_for_process) return;  // caught already: keep what came
  g_signalled = false;
  install(sig, &g_previous);
}

Preemption::~Preemption() {
  const int sig = launch::signal_number(signal_);
  if (sig != 0 && sig != g_caught_for_process) ::sigaction(sig, &g_previous, nullptr);
}

bool Preemption::stop_after(int64_t step) {
  if (signal_ == launch::CheckpointSignal::Off) return false;
  const auto now = Clock::now();
  // The fastest step so far sets the margin; the first call measures nothing (it follows the
  // run's setup), so a proposal waits for the second.
  if (last_step_) {
    const double took = std::chrono::duration<double>(now - *last_step_).count();
    fastest_step_ = fastest_step_ > 0 ? std::min(fastest_step_, took) : took;
  }
  last_step_ = now;
  try {
    agree(step, now);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // LibTorch's client: its timeout, a closed connection
    const std::string why = e.what();
    DTORCH_FAIL(CommError, "rank ", rank_,
                ": the rendezvous store did not answer a look for the checkpoint signal's step (",
                why.substr(0, why.find('\n')),
                ")\n---> HINT: the process serving it (the launcher, or rank 0) ended or is "
                "stopped, or a stranger holds LibTorch 1.13's store server (docs/launch.md); "
                "DTORCH_TIMEOUT sets how long a store call waits");
  }
  if (!agreed_) return false;
  // Ranks a step apart at most hear of it before their step passes it (see the Note).
  DTORCH_CHECK_T(TrainingError, step <= *agreed_, "rank ", rank_, " heard at step ", step,
                 " that the job checkpoints after step ", *agreed_,
                 ", which it has passed; its ranks drifted further apart than a step");
  return step == *agreed_;
}

void Preemption::agree(int64_t step, std::chrono::steady_clock::time_point now) {
  if (!agreed_ && g_signalled.load() && !proposed_ && fastest_step_ > 0) {
    proposed_ = true;
    const std::string mine = std::to_string(proposed_stop(step, fastest_step_, kLookEvery));
    // The first proposal wins: compareSet sets the key only where it is absent.
    agreed_ = parse_step(store_.compareSet(kStopKey, std::vector<uint8_t>{},
                                           std::vector<uint8_t>(mine.begin(), mine.end())));
    if (rank_ == 0) {
      log::info("got SIG", name_of(signal_), " at step ", step,
                ": every rank checkpoints after step ", *agreed_, " and stops");
    }
  } else if (!agreed_ && std::chrono::duration<double>(now - last_look_).count() >= kLookEvery) {
    last_look_ = now;
    if (store_.check({kStopKey})) {
      agreed_ = parse_step(store_.get(kStopKey));
      if (rank_ == 0)
        log::info("the job checkpoints after step ", *agreed_, " (another rank got SIG",
                  name_of(signal_), ") and stops");
    }
  }
}

}  // namespace dtorch::train
