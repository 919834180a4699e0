// What every fuzz harness shares: a scratch folder in /dev/shm for readers that take a path,
// the fixtures make_seeds.sh made, and the rule that decides what counts as a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <system_error>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"

namespace dtorch::fuzz {

// Note [Two drivers]
// A harness is one function, DTORCH_FUZZ_TARGET(name) { ... } in tests/fuzz/NAME_fuzz.cpp,
// driven two ways. `make fuzz` (run.sh) builds each as a program of its own with clang, where it
// is libFuzzer's LLVMFuzzerTestOneInput: coverage-guided, under ASan and UBSan, for minutes. The
// test suite compiles all of them into dtorch_tests with whatever compiler builds it, where each
// is registered by name and FuzzSmoke.* (smoke_test.cpp) gives it its seeds, then random mutations
// of them for a few seconds: no coverage feedback and no sanitizers (unless the suite itself is
// sanitized), but CI tries inputs no test names (a fixed mutation seed unless one is given, so
// every machine tries the same ones) and replays what make_seeds.sh makes.

/// A harness: one input in, 0 out (libFuzzer's "keep going"); a finding throws or aborts.
using Target = int (*)(const uint8_t* data, size_t size);

/// The harnesses compiled into this program, by name (the test suite's driver).
inline std::map<std::string, Target>& targets() {
  static std::map<std::string, Target> all;
  return all;
}

inline bool register_target(const char* name, Target target) {
  targets()[name] = target;
  return true;
}

#ifdef DTORCH_FUZZ_IN_TESTS
#define DTORCH_FUZZ_TARGET(name)                                   \
  static int name##_fuzz_target(const uint8_t* data, size_t size); \
  [[maybe_unused]] static const bool name##_fuzz_registered =      \
      ::dtorch::fuzz::register_target(#name, &name##_fuzz_target); \
  static int name##_fuzz_target(const uint8_t* data, size_t size)
#else
#define DTORCH_FUZZ_TARGET(name) \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
#endif

// Note [What a finding is]
// A reader answers bad input with a dtorch::Error (ConfigError, DataError, CheckpointError, ...)
// naming the file and the fix: that is the expected outcome, and accept_errors() swallows it.
// Anything else is a finding: another exception type (nlohmann's, c10::Error, std::bad_alloc,
// std::length_error) escaping a reader is left uncaught, so the C++ runtime terminates inside
// the throw and libFuzzer reports the crash with the throwing frame on top of the stack; so are
// a sanitizer report, a crash, and an input that runs past -timeout.

/// Runs `read`; returns 0 (libFuzzer's "keep going") when it succeeds or throws dtorch::Error.
template <class F>
int accept_errors(F&& read) {
  try {
    read();
  } catch (const dtorch::Error&) {
  }
  return 0;
}

/// This process's scratch folder, dtorch-fuzz-PID in $DTORCH_FUZZ_SCRATCH (run.sh's, which it
/// removes with everything a crashed process left) or in /dev/shm (tmpfs: no disk writes per
/// input); made on first use and removed when the process exits normally.
inline const std::string& scratch() {
  static const std::string dir = [] {
    const char* env = std::getenv("DTORCH_FUZZ_SCRATCH");
    std::string d =
        paths::join(env && *env ? env : "/dev/shm", "dtorch-fuzz-" + std::to_string(::getpid()));
    paths::remove_all(d);
    paths::create_directories(d);
    return d;
  }();
  static const bool cleanup = [] {
    return std::atexit([] {
             std::error_code ec;
             paths::remove_all(dir, ec);
           }) == 0;
  }();
  (void)cleanup;
  return dir;
}

/// Writes `size` bytes at `data` to `path` (replacing it) and returns `path`.
inline std::string write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

/// Folder NAME of the fixtures make_seeds.sh writes beside the seeds ($DTORCH_FUZZ_SEEDS, by
/// default the build folder's seeds/); aborts saying how to make them when it is missing.
inline std::string fixture(const std::string& name) {
  const char* env = std::getenv("DTORCH_FUZZ_SEEDS");
  const std::string dir = paths::join(env && *env ? env : DTORCH_FUZZ_SEEDS, "fixtures", name);
  if (!paths::is_directory(dir)) {
    std::fprintf(stderr, "fuzz: no fixture %s: run tests/fuzz/make_seeds.sh first\n", dir.c_str());
    std::abort();
  }
  return dir;
}

/// A fresh folder scratch()/NAME whose entries are symlinks to those of `fixture_dir`, for a
/// harness to add its fuzzed file to.
inline std::string folder_of_links(const std::string& name, const std::string& fixture_dir) {
  const std::string dir = paths::join(scratch(), name);
  paths::remove_all(dir);
  paths::create_directories(dir);
  for (const std::string& entry : paths::list_directory(fixture_dir))
    paths::create_symlink(paths::join(fixture_dir, entry), paths::join(dir, entry));
  return dir;
}

}  // namespace dtorch::fuzz
