// Files replaced whole or not at all: every file dtorch writes for keeps (checkpoints, model
// files, pictures) goes through here, so a crash or a full disk mid-write never destroys the
// previous good file.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

namespace dtorch {

/// Writes `n` bytes at `data` to `path` atomically: a temporary file in the same directory
/// (named with this process's id, so two writers of one path never share it), fsync, rename,
/// fsync of the directory. A `path` holding anything but a regular file (a directory, a device,
/// a FIFO) is refused, untouched. Returns nothing on success; on failure the temporary is removed,
/// whatever was at `path` is untouched, and the result says what failed ("cannot write
/// PATH: ... (disk full or not writable?)"), for the caller to throw as its kind of error.
std::optional<std::string> write_file_atomically(const std::string& path, const char* data,
                                                 size_t n);

/// Takes a file's bytes as they are made: `n` bytes at `data`, appended. Returns false once a
/// write has failed (the failure is reported when the file is closed; what follows is dropped).
using ByteSink = std::function<bool(const char* data, size_t n)>;

/// The same, for bytes that `fill` hands to the sink it is given as it makes them, so a file of
/// gigabytes is never held in memory whole. An exception from `fill` removes the temporary and
/// passes on, the previous file untouched.
std::optional<std::string> write_file_atomically(const std::string& path,
                                                 const std::function<void(const ByteSink&)>& fill);

}  // namespace dtorch
