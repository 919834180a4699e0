// The file a rank's state lives in while it is on disk (Note [Optimizer state on disk] in
// offload.h, Note [Parameters on disk] in param_offload.h): made in the offload folder with all
// its space reserved, and unlinked at once, so a run leaves nothing behind however it ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dtorch::zero {
namespace offload_file {

/// Offsets, lengths and addresses in whole pages: O_DIRECT needs 4 KiB, a mapping of the file
/// the system's page.
size_t page_bytes();
/// `n` rounded up to whole pages.
size_t aligned(size_t n);
/// "1.25 GiB"
std::string gib(uint64_t bytes);

struct Made {
  int fd = -1;
  std::string path;  ///< where it was made; unlinked since
};

/// Makes `name` in `dir` with `bytes` reserved (the free space checked, then fallocate, which
/// never runs on more than is free), opened with O_DIRECT when `direct` and the filesystem allows
/// it, and unlinks it. ConfigError naming the folder when it does not exist or cannot be
/// written, and the bytes `what` (this rank's optimizer state, ...) needs against those free.
Made make(const std::string& dir, const std::string& name, size_t bytes, bool direct,
          const std::string& what);

/// Writes (or reads) `n` bytes at `data` to (or from) byte `at` of the file; "" or why not.
std::string move_bytes(int fd, bool write, char* data, size_t n, size_t at);

/// For a checkpoint written in the background (Note [Checkpoints in the background]): the
/// first `bytes` of the file `fd` (made at `path` in `dir`) copied into a second file beside it
/// (by the kernel where it can; unlinked as soon as it is made) and mapped privately, so that
/// what later changes the first does not reach it and memory does not hold it; the copy goes
/// with the last holder of the mapping. TrainingError naming both files when the disk fails.
std::shared_ptr<char> copy_and_map(int fd, size_t bytes, const std::string& path,
                                   const std::string& dir, const std::string& what);

}  // namespace offload_file
}  // namespace dtorch::zero
