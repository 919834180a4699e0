// A store whose every call runs under a watchdog, so that a rendezvous store that stops
// answering is named within its timeout instead of holding a process forever.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <functional>
#include <string>

namespace c10d {
class Store;
}

namespace dtorch::launch {

/// Note [Store watchdog]
/// A call on LibTorch's TCPStore client can block without end: 1.13's client sets no receive
/// timeout until its first wait, and no client gives up on a server that keeps the connection
/// open but never answers (a launcher or rank 0 stopped by SIGSTOP or a debugger, a program on
/// the port that is not a store, a 1.13 store frozen by a peer's half message). The stores
/// serve_store and connect_store make are watched: one thread per process looks at the calls
/// in flight every second. A call that has waited 10 s is announced (what it waits for, where,
/// for how long of what timeout, and DTORCH_TIMEOUT, which sets it), again every 10 s; a call
/// that outlives its timeout by 3 s (a connection's handshake, which retries with a backoff, by
/// 10 s), which the client's own timeout did not end, is named as an error and the process exits
/// with status 1. Nothing else can end it: the call sits in a receive inside LibTorch. The
/// launcher then names the rank that ended, as for any failure. Closing a store is bounded as
/// well: a served store whose server does not stop within 2 s (LibTorch's classic server held
/// by a client's unfinished request) is left to the process's exit.

/// `inner` with every call watched; `where` ("host:port") names it in messages.
c10::intrusive_ptr<c10d::Store> watched_store(c10::intrusive_ptr<c10d::Store> inner,
                                              std::string where);

/// The store a watched_store wraps; `store` itself when it is not one.
c10d::Store& unwatched(c10d::Store& store);

/// Runs `connect` (which makes a store client, waiting for its server) under the watchdog, as
/// a call on `where` limited by `timeout`. For LibTorch's client constructor, whose own
/// handshake can wait for an answer that never comes.
c10::intrusive_ptr<c10d::Store> watched_connect(
    const std::string& where, std::chrono::milliseconds timeout,
    const std::function<c10::intrusive_ptr<c10d::Store>()>& connect);

}  // namespace dtorch::launch
