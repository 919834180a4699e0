// Which TCPStore protocol a store speaks, asked before LibTorch's client talks to it: a client
// of one PyTorch generation and a store of the other never understand each other, and LibTorch
// 1.13's client then waits forever without a word (Note [TCPStore dialects]).
#pragma once

#include <chrono>
#include <string>

// Note [TCPStore dialects]
// PyTorch 2.x's TCPStore client opens each connection with VALIDATE (byte 00 and the magic
// number 0x3C85F7CE) and numbers its queries one higher than 1.13 does (SET 0 -> 1, CHECK 4 ->
// 5, GETNUMKEYS 6 -> 7); 1.13 knows no VALIDATE. So a 1.13 client in a store of torchrun 2.x
// sends SET as 00, which the server (libuv) takes for a VALIDATE with a wrong magic number and
// then neither answers nor closes: the client's CHECK waits in recv forever, as 1.13's client
// sets no receive timeout. A 2.x client in a 1.13 store is dropped at every try, and retries
// with a backtrace each time until its timeout. Neither LibTorch's client can speak the other
// dialect, so before connecting dtorch asks with two read-only probes, each one whole message
// in one write (a 1.13 server serves one connection at a time, and a half message stops it):
//   V: 00 ce f7 85 3c 07 07 07 07 -- VALIDATE and four 2.x GETNUMKEYS. A 2.x server answers
//      four 8-byte counts; a 1.13 server reads a SET whose key length (about 5e17) it cannot
//      allocate and closes the connection at once.
//   L: 06 -- 1.13's GETNUMKEYS: a 1.13 server answers one 8-byte count; a 2.x server is silent
//      or closes.
// A store that answers V speaks 2.x, one that answers L speaks 1.13; this build's own dialect's
// probe goes first, so a store of its own kind costs one round trip. Anything else (no answer
// within 2 s, a refused connection) is left to LibTorch's client as before.
// The version of the other side is named where it can be known: a torchrun worker's parent is
// the torchrun agent serving the store, and the libtorch_cpu.so it mapped tells its version.

namespace dtorch::launch {

enum class StoreDialect { Torch1, Torch2, Unknown };

/// The dialect of the store at addr:port: `first`'s probe, and the other's when it gets no
/// answer (at most about 4 s in all; a store of `first`'s dialect answers in milliseconds).
StoreDialect probe_store_dialect(const std::string& addr, int port, StoreDialect first);

/// The PyTorch version of process `pid`'s LibTorch ("2.15.0+cu132", "1.13.0"), read from the
/// libtorch_cpu.so it has mapped; "" when it has none or the version cannot be read.
std::string torch_version_of_process(int pid);

/// Throws CommError, naming both versions and the fix, when the store at addr:port speaks the
/// other generation's protocol than this build's LibTorch.
void check_store_dialect(const std::string& addr, int port);

}  // namespace dtorch::launch
