// Asking a fork server (Note [Fork server] in process.h) for a process, and the wire that such
// requests, and the requests of forks waiting to become workers (Note [Forked workers]), travel
// on. Plain POSIX and no LibTorch: the test suite's client (tests/support/test_client.cpp)
// links it alone, to start in a millisecond.
#pragma once

#include <sys/types.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

namespace dtorch::launch {

/// A process a fork server started: its pid, and the socket its wait status comes on. Closing
/// that socket before the status came ends the process: its server kills it.
struct ServedFork {
  pid_t pid = -1;
  int status_fd = -1;  ///< close-on-exec; the caller closes it
};

/// Asks the fork server at `server` to run `argv` with `env` ("NAME=value" each, the whole
/// environment) in the directory open at `dir_fd`, with `streams` as stdin, stdout and stderr.
/// None when the server is gone. One request at a time per socket: callers serialize.
std::optional<ServedFork> request_fork(int server, const std::vector<std::string>& argv,
                                       const std::vector<std::string>& env, int dir_fd,
                                       const std::array<int, 3>& streams);

/// The served fork's wait status once it ends; none if it has not ended within `limit_seconds`.
/// Throws when the server ended first (the status is lost).
std::optional<int> wait_served(const ServedFork& fork, double limit_seconds);

/// A socket listening on `name` in the abstract namespace of local sockets (no file; the name
/// goes with the socket), for clients of this user (a fork server checks each); -1 with
/// errno set when it cannot listen there, EADDRINUSE when another socket holds the name.
int listen_local(const std::string& name);

/// A socket connected to the listener on `name`, when a process of this user holds it; else -1.
int connect_local(const std::string& name);

/// Whether the process at the other end of the local socket `sock` runs as this user: anyone
/// may hold or connect to a name, and only this user's processes trade streams and forks.
bool peer_is_this_user(int sock);

// ---- Named fork servers ----------------------------------------------------------------------
// A fork server that many processes share listens on a name (listen_local): the test binary's,
// for ctest's tests (Note [Test server]), and `dtorch`'s, for the command lines those tests run.
// A client connects to it, or starts it when none listens: the program with `variable`=name in
// its environment, whose main() calls serve_forks_when_asked (process.h) first.

/// The name of `binary`'s fork server `what` for this user, this build of the binary (device,
/// inode, modification time, size: a rebuilt one gets a server of its own) and this environment
/// `env` less the variables whose names start with `ignored` (a server read the others as its
/// libraries loaded). Empty when the binary cannot be looked at.
std::string fork_server_name(const std::string& what, const std::string& binary,
                             const std::vector<std::string>& env, const std::string& ignored);

/// A connection to the fork server on `name`, for one request, starting one when none listens:
/// `binary` with `variable`=name added to this environment, in a session of its own and not
/// our child, in "/", its streams /dev/null (nothing that waits for ours waits for it). -1 when
/// none answers; then the caller exec's instead.
int connect_fork_server(const std::string& binary, const std::string& variable,
                        const std::string& name);

// ---- The wire ----------------------------------------------------------------------------
// A request is its size and descriptors in one message, then its bytes: a command line and an
// environment, each list its size and then its strings, each ended by a NUL.
namespace wire {

std::string encode_request(const std::vector<std::string>& argv,
                           const std::vector<std::string>& env);
bool decode_request(const std::string& in, std::vector<std::string>& argv,
                    std::vector<std::string>& env);

/// Sends the request with descriptors fds[0..count); false when the receiving end is gone.
/// At most kMaxRequestFds descriptors.
bool send_request(int sock, const std::string& request, const int* fds, std::size_t count);
/// What send_request sent, with exactly `count` descriptors; false when the sender closed its
/// end instead, or sent something else.
bool receive_request(int sock, std::string& request, int* fds, std::size_t count);
constexpr std::size_t kMaxRequestFds = 5;

/// Writes or reads all `size` bytes; false when the other end is gone first.
bool write_all(int fd, const char* data, std::size_t size);
bool read_all(int fd, char* data, std::size_t size);
/// Whether `fd` has something to read (or its end) within `seconds`.
bool readable_within(int fd, double seconds);

}  // namespace wire
}  // namespace dtorch::launch
