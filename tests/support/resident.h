// Test helper: this process's resident memory, for tests of what dtorch keeps in memory.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace dtorch::testing {

/// What a resident-set measure counts. A test runs as a fork of the test server (Note [Test
/// server]), whose file-backed pages (LibTorch's code) are not in a fork's page tables until
/// the fork touches them: the first call of a LibTorch function in a test adds megabytes to
/// its resident set, more or fewer with what the server ran. `Anonymous` counts the heap,
/// tensors and stacks only; `All` counts mapped files too (call what is measured once before
/// the first measure, so that its code is in).
enum class Resident { All, Anonymous };

/// This process's resident bytes now, of the kind asked (/proc/self/status: VmRSS, RssAnon).
inline int64_t resident_bytes(Resident which) {
  const std::string field = which == Resident::All ? "VmRSS:" : "RssAnon:";
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.compare(0, field.size(), field) == 0)
      return std::stoll(line.substr(field.size())) * 1024;
  return -1;
}

}  // namespace dtorch::testing
