// TCPStore serving and joining, with errors that say which address and port failed.
#include "dtorch/launch/store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <thread>

#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/parse_whole_number.h"
#include "dtorch/launch/store_listen.h"
#include "dtorch/launch/store_probe.h"
#include "dtorch/launch/watched_store.h"

namespace dtorch::launch {
namespace {

// Note [TCPStore backend]
// From 2.4 LibTorch serves a TCPStore with libuv by default (TCPStoreOptions::useLibUV), and
// a LibTorch built without libuv (Debian 13's 2.6, for one) then refuses to create any store:
// "use_libuv was requested but PyTorch was build without libuv support". dtorch asks for libuv
// where the option exists and, when the LibTorch answers that it lacks it, uses the classic
// server, which speaks the same protocol. USE_LIBUV=0, PyTorch's own switch, asks for the
// classic server from the start. 1.13 has only the classic server.
void set_store_libuv(c10d::TCPStoreOptions& o, bool on) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  o.useLibUV = on;
#else
  (void)o;
  (void)on;
#endif
}

/// Whether `store` is served by libuv (false for clients and on LibTorch < 2.4).
bool store_uses_libuv(const c10d::TCPStore& store) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return store.isLibUvBackend();
#else
  (void)store;
  return false;
#endif
}

bool mentions_libuv(const std::string& s) {
  std::string lower;
  for (char c : s)
    lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower.find("libuv") != std::string::npos;
}

c10::intrusive_ptr<c10d::TCPStore> make_tcp_store(const std::string& host,
                                                  c10d::TCPStoreOptions o) {
  const bool want_libuv = kStoreHasLibuv && env::get("USE_LIBUV").value_or("1") != "0";
  set_store_libuv(o, want_libuv);
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const std::exception& e) {
    if (!want_libuv || !mentions_libuv(e.what())) throw;
    log::debug("this LibTorch has no libuv TCPStore (", e.what(), "); using the classic one");
  }
  set_store_libuv(o, false);
  return c10::make_intrusive<c10d::TCPStore>(host, o);
}

}  // namespace

c10::intrusive_ptr<c10d::Store> serve_store(int port, int world_size,
                                            std::chrono::milliseconds timeout,
                                            const std::string& listen) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = true;
  o.numWorkers = c10::nullopt;  // clients are counted by dtorch's own rendezvous keys
  o.waitWorkers = false;
  o.timeout = timeout;
  // Note [Where the store listens]: the server's own client reaches it where it listens.
  std::string self = "127.0.0.1";
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  if (!listen.empty()) {
    const int fd = listen_on(listen, port);  // LibTorch's server owns it from here
    o.masterListenFd = fd;
    o.port = static_cast<std::uint16_t>(bound_port(fd));
    self = listen;
  }
#else
  (void)listen;  // LibTorch listens on every interface
#endif
  try {
    auto store = make_tcp_store(self, o);
    const int served = store->getPort();
    return watched_store(std::move(store),
                         str("port ", served, " of this host"));  // Note [Store watchdog]
  } catch (const std::exception& e) {
    DTORCH_FAIL(CommError, "cannot serve the rendezvous store on port ", port, ": ", e.what(),
                "\n---> HINT: another job probably uses this port; pick another with "
                "--master-port (or MASTER_PORT), or use --standalone for a free one");
  }
}

int served_port(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* tcp = dynamic_cast<c10d::TCPStore*>(&unwatched(*store));
  DTORCH_CHECK(tcp, "served_port: not a TCPStore");
  return tcp->getPort();
}

bool served_by_libuv(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* tcp = dynamic_cast<c10d::TCPStore*>(&unwatched(*store));
  DTORCH_CHECK(tcp, "served_by_libuv: not a TCPStore");
  return store_uses_libuv(*tcp);
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  DTORCH_CHECK_T(CommError, fd >= 0, "cannot open a socket: ", std::strerror(errno));
  struct sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  int e = errno;
  ::close(fd);
  DTORCH_CHECK_T(CommError, ok, "cannot find a free TCP port: ", std::strerror(e));
  return ntohs(a.sin_port);
}

c10::intrusive_ptr<c10d::Store> connect_store(const std::string& addr, int port,
                                              std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  check_store_dialect(addr, port);  // Note [TCPStore dialects]
  try {
    // Note [Store watchdog]
    return watched_connect(str(addr, ":", port), timeout, [&] { return make_tcp_store(addr, o); });
  } catch (const std::exception& e) {
    DTORCH_FAIL(CommError, "cannot reach the rendezvous store at ", addr, ":", port, " within ",
                timeout.count() / 1000.0, " s: ", e.what(),
                "\n---> HINT: check MASTER_ADDR/MASTER_PORT (--master-addr/--master-port), that "
                "rank 0 or the launcher of node 0 is running, and that no firewall blocks the "
                "port");
  }
}

namespace {
const std::string kJobKey = "dtorch/job";
const std::string kOneJob =
    "\n---> HINT: another job uses that port. Give every node of one job the same --rdzv-id, and "
    "each job its own --master-port (--rdzv-endpoint)";
}  // namespace

void claim_store_for_job(c10d::Store& store, const std::string& run_id, const std::string& where) {
  const std::vector<uint8_t> mine(run_id.begin(), run_id.end());
  // compareSet sets the key only where it is absent, and answers with what it holds then.
  const auto held = store.compareSet(kJobKey, {}, mine);
  DTORCH_CHECK_T(CommError, held == mine, "the rendezvous store at ", where, " belongs to job '",
                 std::string(held.begin(), held.end()), "', not to this launcher's job '", run_id,
                 "' (--rdzv-id)", kOneJob);
}

void check_store_job(c10d::Store& store, const std::string& run_id, const std::string& where) {
  if (!store.check({kJobKey})) return;  // served by another launcher (torchrun) or by rank 0
  const auto held = store.get(kJobKey);
  DTORCH_CHECK_T(CommError, std::string(held.begin(), held.end()) == run_id,
                 "the rendezvous store at ", where, " belongs to job '",
                 std::string(held.begin(), held.end()),
                 "', but this worker's TORCHELASTIC_RUN_ID is '", run_id,
                 "': it was started for another job", kOneJob);
}

int64_t number_in_store(const std::string& value, const std::string& key) {
  const std::optional<int64_t> n = parse_whole_number(value);
  DTORCH_CHECK_T(CommError, n.has_value(), "the rendezvous store holds '", value.substr(0, 40),
                 value.size() > 40 ? "...'" : "'", " under ", key,
                 ", which is no number: something other than this job's processes wrote it",
                 "\n---> HINT: only the job's own processes should reach its store; see "
                 "--rdzv-listen");
  return *n;
}

std::vector<int> Arrivals::missing() const {
  std::vector<int> m;
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i].empty()) m.push_back(static_cast<int>(i));
  return m;
}

bool announce_and_wait(c10d::Store& store, const std::string& prefix, int self,
                       const std::string& value, int count,
                       std::chrono::steady_clock::time_point deadline, Arrivals& a,
                       const WaitNotice& notice) {
  using Clock = std::chrono::steady_clock;
  DTORCH_CHECK(self < 0 || !value.empty(),
               "announce_and_wait: an announced value must not be empty");
  if (self >= 0)
    store.set(prefix + std::to_string(self), std::vector<uint8_t>(value.begin(), value.end()));
  a.values.assign(static_cast<size_t>(count), "");
  const auto start = Clock::now();
  auto next_notice = start + notice.after;
  for (;;) {
    bool all = true;
    for (int i = 0; i < count; ++i) {
      std::string& v = a.values[static_cast<size_t>(i)];
      if (!v.empty()) continue;
      const std::string key = prefix + std::to_string(i);
      if (!store.check({key})) {
        all = false;
        continue;
      }
      auto bytes = store.get(key);
      v.assign(bytes.begin(), bytes.end());
      if (v.empty()) v = "?";  // arrived without a name
    }
    const auto now = Clock::now();
    if (all || now >= deadline) return all;
    if (notice.say && now >= next_notice) {
      notice.say(a, std::chrono::duration<double>(now - start).count());
      next_notice = now + notice.after;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace dtorch::launch
