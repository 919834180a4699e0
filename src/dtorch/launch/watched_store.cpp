// The store watchdog (Note [Store watchdog]): a c10d::Store that forwards every call to the
// TCPStore it wraps while one thread per process watches how long each call has waited.
#include "dtorch/launch/watched_store.h"

#include <unistd.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"

namespace dtorch::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
constexpr auto kNoticeEvery = std::chrono::seconds(10);
// How long past its timeout a call may run, for the client's own timeout to end it first: a call
// on a connected store ends within its timeout, but the connection's handshake retries with a
// backoff that can take it one delay (seconds, growing) past its own.
constexpr milliseconds kCallGrace{3000};
constexpr milliseconds kHandshakeGrace{10000};
// How long closing a store may take (close_within).
constexpr milliseconds kCloseWithin{2000};

long long whole_seconds(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}

struct Call {
  std::string what;  // "a check of 'k'"
  std::string where;
  Clock::time_point start;
  milliseconds timeout;  // zero: none (c10d's kNoTimeout), so the call is announced, never ended
  milliseconds grace;    // kCallGrace or kHandshakeGrace
  Clock::time_point next_notice;
};

// c10d's kNoTimeout is zero; a timeout beyond a day is none either (and would overflow below).
milliseconds limit_of(milliseconds timeout) {
  return timeout > milliseconds::zero() && timeout < std::chrono::hours(24) ? timeout
                                                                            : milliseconds::zero();
}

class Watchdog {
 public:
  // Never destroyed: its thread sleeps through the process's exit.
  static Watchdog& instance() {
    static Watchdog* w = new Watchdog;
    return *w;
  }

  uint64_t begin(std::string what, const std::string& where, milliseconds timeout,
                 milliseconds grace) {
    std::lock_guard<std::mutex> lock(mu_);
    // A process forked from one that watched has no watchdog thread: start its own.
    if (thread_pid_ != ::getpid()) {
      thread_pid_ = ::getpid();
      std::thread([this] { loop(); }).detach();
    }
    const auto now = Clock::now();
    calls_[++last_id_] =
        Call{std::move(what), where, now, limit_of(timeout), grace, now + kNoticeEvery};
    return last_id_;
  }

  void end(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.erase(id);
  }

 private:
  Watchdog() = default;

  void loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = Clock::now();
      for (auto& [id, c] : calls_) {
        const auto waited = now - c.start;
        const auto seconds = whole_seconds(waited);
        const bool limited = c.timeout > milliseconds::zero();
        if (limited && waited >= c.timeout + c.grace) {
          log::error(
              "the rendezvous store at ", c.where, " has not answered ", c.what, " for ", seconds,
              " s, past its timeout of ", c.timeout.count() / 1000.0,
              " s: the process serving it is stopped or stuck, a stranger holds it with a "
              "request it never finished (LibTorch's classic server, as 1.13's), or what "
              "listens on that port is not a store; ending this process",
              "\n---> HINT: check that the launcher (or rank 0) serving the store runs and "
              "is not stopped, and that the job's --master-port/--rdzv-endpoint is its "
              "own; DTORCH_TIMEOUT (workers) or --rdzv-timeout (launchers) sets the timeout");
          std::fflush(stderr);
          std::_Exit(1);
        }
        if (now >= c.next_notice) {
          const double timeout_s = c.timeout.count() / 1000.0;
          const std::string limit =
              !limited ? std::string("the call has no timeout")
              : waited < c.timeout
                  ? str("its timeout is ", timeout_s, " s")
                  : str("past its timeout of ", timeout_s, " s; this process ends at ",
                        whole_seconds(c.timeout + c.grace), " s unless it answers");
          log::info("waiting ", seconds, " s so far for the rendezvous store at ", c.where,
                    " to answer ", c.what, " (", limit,
                    "; DTORCH_TIMEOUT for workers, --rdzv-timeout for launchers)");
          c.next_notice = now + kNoticeEvery;
        }
      }
    }
  }

  std::mutex mu_;
  std::map<uint64_t, Call> calls_;
  uint64_t last_id_ = 0;
  pid_t thread_pid_ = 0;
};

// One watched call: announced and ended by the watchdog while it lasts.
class Watch {
 public:
  Watch(std::string what, const std::string& where, milliseconds timeout,
        milliseconds grace = kCallGrace)
      : id_(Watchdog::instance().begin(std::move(what), where, timeout, grace)) {}
  ~Watch() { Watchdog::instance().end(id_); }
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

 private:
  uint64_t id_;
};

std::string keys_text(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 4; ++i)
    s += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 4) s += str(" and ", keys.size() - 4, " more");
  return s;
}

// Closes `store` (the last reference, as a rule), waiting for it at most kCloseWithin. A served
// store's destructor joins its server thread, and LibTorch's classic server can sit in a
// client's half-sent request for good (Note [TCPStore backend]): then the store is left to the
// process's exit, which does not wait for it, and the launcher still ends.
void close_within(c10::intrusive_ptr<c10d::Store> store, const std::string& where) {
  // A mutex and a condition variable, not std::future: its wait imports a libstdc++ symbol
  // that PyPI's LibTorch exports too (Note [No std::filesystem]).
  struct Closing {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto closing = std::make_shared<Closing>();
  std::thread([store = std::move(store), closing]() mutable {
    store.reset();
    std::lock_guard<std::mutex> lock(closing->mu);
    closing->done = true;
    closing->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(closing->mu);
  if (closing->cv.wait_for(lock, kCloseWithin, [&] { return closing->done; })) return;
  log::warn("the rendezvous store at ", where, " did not close within ",
            whole_seconds(kCloseWithin),
            " s: a client holds its server with a request it never finished (LibTorch's classic "
            "server answers one at a time); leaving it to this process's exit");
}

class WatchedStore : public c10d::Store {
 public:
  WatchedStore(c10::intrusive_ptr<c10d::Store> inner, std::string where)
      : c10d::Store(inner->getTimeout()), inner_(std::move(inner)), where_(std::move(where)) {}
  ~WatchedStore() override { close_within(std::move(inner_), where_); }

  c10d::Store& inner() { return *inner_; }
  const std::string& where() const { return where_; }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Watch w(str("a set of '", key, "'"), where_, timeout_);
    inner_->set(key, value);
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    Watch w(str("a compare-and-set of '", key, "'"), where_, timeout_);
    return inner_->compareSet(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    Watch w(str("a get of '", key, "' (it waits for the key to be set)"), where_, timeout_);
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    Watch w(str("an add to '", key, "'"), where_, timeout_);
    return inner_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    Watch w(str("a delete of '", key, "'"), where_, timeout_);
    return inner_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    Watch w(str("a check of ", keys_text(keys)), where_, timeout_);
    return inner_->check(keys);
  }
  int64_t getNumKeys() override {
    Watch w("a count of its keys", where_, timeout_);
    return inner_->getNumKeys();
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    Watch w(str("a wait for ", keys_text(keys)), where_, timeout);
    inner_->wait(keys, timeout);
  }
  void setTimeout(const milliseconds& timeout) override {
    c10d::Store::setTimeout(timeout);
    inner_->setTimeout(timeout);
  }
  using c10d::Store::compareSet;  // the string overloads, which call the virtual ones
  using c10d::Store::set;

 private:
  c10::intrusive_ptr<c10d::Store> inner_;
  std::string where_;
};

// LibTorch 2.x's Store declares clone() (a client of its own, for another thread) pure virtual;
// 1.13's has none. The specialisation adds it where the Store declares it.
template <class Core, class = void>
struct WithClone : Core {
  using Core::Core;
};
template <class Core>
struct WithClone<Core, std::void_t<decltype(std::declval<Core&>().clone())>> : Core {
  using Core::Core;
  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<WithClone>(this->inner().clone(), this->where());
  }
};
using Watched = WithClone<WatchedStore>;

}  // namespace

c10::intrusive_ptr<c10d::Store> watched_store(c10::intrusive_ptr<c10d::Store> inner,
                                              std::string where) {
  return c10::make_intrusive<Watched>(std::move(inner), std::move(where));
}

c10d::Store& unwatched(c10d::Store& store) {
  auto* w = dynamic_cast<WatchedStore*>(&store);
  return w ? w->inner() : store;
}

c10::intrusive_ptr<c10d::Store> watched_connect(
    const std::string& where, milliseconds timeout,
    const std::function<c10::intrusive_ptr<c10d::Store>()>& connect) {
  Watch w("the connection's handshake", where, timeout, kHandshakeGrace);
  return watched_store(connect(), where);
}
}  // namespace dtorch::launch
