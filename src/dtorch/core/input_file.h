// Files dtorch reads: regular files only, of bounded size, opened without blocking, so a path
// that names a directory, a FIFO, a device or a runaway file gets a one-line error instead of a
// misleading message, a hang, or gigabytes read until memory runs out (Note [Input files]).
#pragma once

#include <cstdint>
#include <string>

#include "dtorch/core/error.h"

// Note [Input files]
// Every file a user names (a config, a corpus, an image, an IDX or CIFAR file, a checkpoint, a
// layout file) is opened with O_NONBLOCK, so a FIFO nobody writes to cannot block the open, and
// then judged by fstat of the open descriptor (not of the path, which could change between the
// two): anything but a regular file is refused, naming what it is. A reader whose format has a
// size limit passes it, so a file that is too large is refused before one byte is read, and a
// file that grows while it is read stops at the limit. Sizes a file announces inside itself
// (an IDX header, a checkpoint's tensor table) are checked against the file's size before they
// are multiplied or allocated, in the readers themselves.

namespace dtorch {

/// The largest small text file dtorch reads whole (config.json, a DeepSpeed JSON, metadata and
/// layout files): 64 MiB, far above any real one.
constexpr uint64_t kMaxTextFileBytes = uint64_t{64} << 20;
/// No size limit (corpora, checkpoints): still a regular file.
constexpr uint64_t kAnySize = ~uint64_t{0};

/// Why `path` cannot be read as an input of at most `max_bytes` bytes, or "" when it can:
/// "no such file", "is a directory, not a file", "is a FIFO (named pipe), not a regular file"
/// (and so for devices and sockets), "cannot be opened: Permission denied", "is 2147483648
/// bytes, more than the 67108864 this reader takes".
std::string input_file_problem(const std::string& path, uint64_t max_bytes = kAnySize);

/// Opens `path` for reading as open(2) does (O_CLOEXEC), after the checks input_file_problem
/// makes, and sets `size`; -1 with `problem` set when it is no input. The caller closes it.
int open_input_file(const std::string& path, uint64_t max_bytes, uint64_t* size,
                    std::string* problem);

/// Reads the whole regular file `path`, of at most `max_bytes` bytes. Returns false with
/// `problem` set as input_file_problem's (or "cannot be read: <errno text>") on failure.
bool read_input_file(const std::string& path, uint64_t max_bytes, std::string* bytes,
                     std::string* problem);

/// The bytes of `path`, or ErrorType "WHAT PATH: PROBLEM" (`what`: "--config", "IDX file").
template <typename ErrorType>
std::string read_input_file(const std::string& path, const std::string& what,
                            uint64_t max_bytes = kMaxTextFileBytes) {
  std::string bytes, problem;
  if (!read_input_file(path, max_bytes, &bytes, &problem))
    DTORCH_FAIL(ErrorType, what, " ", path, ": ", problem);
  return bytes;
}

}  // namespace dtorch
