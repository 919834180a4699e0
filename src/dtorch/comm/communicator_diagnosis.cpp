// Communicator failure diagnosis: what a rank whose collective failed learns from the store
// about the other ranks (dead, stopped, finished early, or in another collective), and the
// CommError that names them (Note [Failure diagnosis]).
#include <signal.h>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "dtorch/comm/communicator.h"
#include "dtorch/comm/communicator_internal.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/launch/process.h"

namespace dtorch::comm {
namespace {

using Clock = std::chrono::steady_clock;
using detail::kStoreAnswers;
using std::chrono::milliseconds;

// Note [Failure diagnosis]
// Gloo reports a dead peer as "connection closed" and a stalled one as a timeout, without
// saying which rank is at fault. On failure every rank posts "failed/<rank>" (with the
// collective it was in) to the store and waits a short window for the others: ranks that
// post nothing are dead or stalled (dead for sure when they ran on this host and their pid is
// gone, stopped when that process is in state T: either ends the wait at once), ranks that
// posted "left/<rank>" finished early, and differing collectives mean the ranks called
// collectives in different orders. The first post has a shorter deadline of its own: a store
// that does not answer it is served by a process that is stopped or gone (rank 0, when the
// workers serve their own store), and saying so sooner ends the job sooner.
constexpr milliseconds kDiagnosisWindow{5000};
// The first post's deadline is kStoreAnswers (communicator_internal.h): creating the process
// group (communicator.cpp) gives the store as long to answer when it fails.

// What this host knows of rank r's process, when r ran here (its rendezvous entry names this
// host): gone (dead for sure), stopped (SIGSTOP, ^Z: state T in /proc), or nothing (another
// host, running, or the store cannot say).
enum class LocalProcess { Unknown, Gone, Stopped };

LocalProcess local_process(c10d::Store& store, int r) {
  try {
    auto v = store.get("arrived/" + std::to_string(r));
    const auto entry = detail::parse_entry(std::string(v.begin(), v.end()));
    if (!entry || entry->host != launch::host_name()) return LocalProcess::Unknown;
    const pid_t pid = entry->pid;
    if (::kill(pid, 0) != 0 && errno == ESRCH) return LocalProcess::Gone;
    if (launch::is_stopped(pid)) return LocalProcess::Stopped;
  } catch (const std::exception&) {
  }
  return LocalProcess::Unknown;
}

// Posts each (key, value) to `store` and asks it one check (a set need not wait for an answer);
// false when that takes longer than `limit`. Asked from a thread of its own, because a LibTorch 2.x
// client blocks on a stopped server past any timeout of its own (the watchdog ends such a call
// only at its timeout + 3 s, Note [Store watchdog]): a thread that never returns is left
// behind, and the caller gives the store up. The store's own errors are rethrown.
// (A mutex and condition variable, not std::future::wait_for, whose libstdc++ symbol PyTorch's
// wheels export a copy of: LinkedSymbols.*)
bool posted_within(c10::intrusive_ptr<c10d::Store> store,
                   std::vector<std::pair<std::string, std::string>> posts, milliseconds limit) {
  struct Answer {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  auto answer = std::make_shared<Answer>();
  std::thread([store, posts = std::move(posts), answer] {
    std::exception_ptr error;
    try {
      for (const auto& [key, value] : posts)
        store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      (void)store->check({posts.back().first});
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(answer->mu);
    answer->done = true;
    answer->error = error;
    answer->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(answer->mu);
  if (!answer->cv.wait_for(lock, limit, [&] { return answer->done; })) return false;
  if (answer->error) std::rethrow_exception(answer->error);
  return true;
}

}  // namespace

namespace detail {

std::string missing_from_gloo(c10d::Store& store, int rank, int world,
                              const std::function<std::string(int)>& name) {
  std::string missing;
  try {
    std::string prefix;
    for (const char* p : {"gloo/0/rank_", "gloo/0/"})
      if (prefix.empty() && store.check({str(p, rank)})) prefix = p;
    if (prefix.empty()) return "";
    auto posted = [&](int r) { return store.check({str(prefix, r)}); };
    for (int r = 0; r < world; ++r) {
      if (r == rank || posted(r)) continue;
      const LocalProcess here = local_process(store, r);
      missing += str(missing.empty() ? "" : ", ", name(r),
                     here == LocalProcess::Gone      ? " (its process on this host is gone)"
                     : here == LocalProcess::Stopped ? " (stopped: SIGSTOP or ^Z)"
                                                     : "");
    }
  } catch (const std::exception&) {
    return "";
  }
  return missing;
}

}  // namespace detail

void Communicator::fail(const std::string& op, long seq, const std::string& cause, int peer) {
  std::string diagnosis;
  try {
    impl_->root_store->setTimeout(kDiagnosisWindow);
    auto& store = *impl_->store;
    const std::string mine = op;
    // Also under a key without the number: a peer that had already moved on to the next
    // collective (or not reached this one) fails there, and is then not silent.
    if (!posted_within(impl_->store,
                       {{str("failed/", seq, "/", rank()), mine}, {str("failing/", rank()), mine}},
                       kStoreAnswers)) {
      impl_->store_silent = true;
      throw std::runtime_error(str("no answer within ", kStoreAnswers.count() / 1000.0, " s"));
    }
    std::vector<int> silent, left, failed, elsewhere, dead, stopped;
    auto deadline = Clock::now() + kDiagnosisWindow;
    for (;;) {
      silent.clear();
      left.clear();
      failed.clear();
      elsewhere.clear();
      dead.clear();
      stopped.clear();
      for (int r = 0; r < size(); ++r) {
        if (r == rank() || (peer >= 0 && r != peer)) continue;
        if (store.check({str("failed/", seq, "/", r)})) {
          failed.push_back(r);
        } else if (store.check({str("failing/", r)})) {
          elsewhere.push_back(r);
        } else if (store.check({str("left/", r)})) {
          left.push_back(r);
        } else {
          const LocalProcess here = local_process(store, r);
          (here == LocalProcess::Gone      ? dead
           : here == LocalProcess::Stopped ? stopped
                                           : silent)
              .push_back(r);
        }
      }
      if (silent.empty() || Clock::now() > deadline) break;
      std::this_thread::sleep_for(milliseconds(100));
    }
    auto join = [this](const std::vector<int>& v) {
      std::vector<std::string> names;
      for (int r : v)
        names.push_back(describe_rank(r));
      return detail::join(names);
    };
    std::ostringstream os;
    if (!dead.empty()) {
      os << "rank(s) " << join(dead) << " died: their processes on this host are gone";
    }
    if (!stopped.empty()) {
      os << (dead.empty() ? "" : "; ") << "rank(s) " << join(stopped)
         << " are stopped (SIGSTOP or ^Z): their processes on this host are in state T";
    }
    if (!silent.empty()) {
      os << (dead.empty() && stopped.empty() ? "" : "; ") << "rank(s) " << join(silent)
         << " did not reach or did not finish this collective: "
         << "dead, stopped, or stuck in other work (look at their logs first)";
    }
    if (!left.empty()) {
      os << (os.tellp() > 0 ? "; " : "") << "rank(s) " << join(left)
         << " had already finished: they ran fewer collectives than this rank";
    }
    std::vector<std::string> disagree;
    for (int r : failed) {
      auto v = store.get(str("failed/", seq, "/", r));
      std::string theirs(v.begin(), v.end());
      if (theirs != mine) disagree.push_back(str("rank ", describe_rank(r), " was in ", theirs));
    }
    for (int r : elsewhere) {
      auto v = store.get(str("failing/", r));
      os << (os.tellp() > 0 ? "; " : "") << "rank " << describe_rank(r) << " failed in "
         << std::string(v.begin(), v.end());
    }
    for (const auto& d : disagree)
      os << (os.tellp() > 0 ? "; " : "") << d;
    if (!disagree.empty()) {
      os << " (every rank must issue the same collectives in the same order)";
    }
    if (os.tellp() == 0) {
      os << (peer >= 0 ? str("rank ", describe_rank(peer), " failed in it too")
                       : std::string("every other rank failed in the same collective"));
    }
    diagnosis = os.str();
  } catch (const std::exception& e) {
    diagnosis = str("the rendezvous store at ", info_.master_addr, ":", info_.master_port,
                    " is unreachable too (", first_line(e.what()), "): the process serving it ",
                    info_.launcher_hosts_store ? "(the launcher of node 0)" : "(rank 0)",
                    " has exited or is stopped");
  }
  DTORCH_FAIL(CommError, "rank ", describe_rank(rank()), ": ", op, " failed: ", first_line(cause),
              "\n  ", diagnosis, "\n---> HINT: a rank that is merely slow (long data loading, a ",
              "checkpoint) needs a longer timeout: DTORCH_TIMEOUT=<seconds> (now ",
              opts_.timeout.count() / 1000.0, " s)");
}

}  // namespace dtorch::comm
