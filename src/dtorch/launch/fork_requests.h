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
/// goes with the socket), for clients of this user (serve_forks_listening checks each); -1 with
/// errno set when it cannot listen there, EADDRINUSE when another socket holds the name.
int listen_local(const std::string& name);

/// A socket connected to the listener on `name`, when a process of this user holds it; else -1.
int connect_local(const std::string& name);

/// Whether the process at the other end of the local socket `sock` runs as this user: anyone
/// may hold or connect to a name, and only this user's processes trade streams and forks.
bool peer_is_this_user(int sock);

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
