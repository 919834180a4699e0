// FuzzSmoke: every fuzz harness (tests/fuzz/*_fuzz.cpp) on its seeds, then on random mutations of
// them for a few seconds (Note [Two drivers] in fuzz_support.h), so that each run of the suite
// tries inputs no test names. A finding (Note [What a finding is]) fails the test naming the
// input's number and the seed that regenerates it, and keeps the input in the build folder's
// fuzz-findings/NAME/, which `make fuzz`'s build-fuzz/fuzz/NAME_fuzz or this test replays.
//
// DTORCH_FUZZ_SMOKE_SECONDS (default 4) sets the time per harness, DTORCH_FUZZ_SMOKE_SEED the
// mutations' seed (default 2, so a run tries a prefix of the same inputs everywhere: a slower
// machine fewer of them), DTORCH_FUZZ_SMOKE_REPLAY=N runs input N alone.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "dtorch/core/paths.h"
#include "fuzz/fuzz_support.h"

namespace dtorch::fuzz {
namespace {

using Bytes = std::vector<uint8_t>;

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

// The seeds make_seeds.sh wrote for harness `name` (the FuzzSeeds.Make test, a fixture).
std::vector<Bytes> read_seeds(const std::string& name) {
  const char* env = std::getenv("DTORCH_FUZZ_SEEDS");
  const std::string dir = paths::join(env && *env ? env : DTORCH_FUZZ_SEEDS, name);
  std::vector<Bytes> seeds;
  std::error_code ec;
  for (const std::string& file : paths::list_directory(dir, ec)) {
    std::ifstream in(paths::join(dir, file), std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return seeds;
}

// Random edits of the kinds that found this project's reader bugs: bits and bytes, integers at
// their limits (sizes, counts, offsets), numbers in text at their limits, lengths cut, ranges
// dropped, repeated or taken from another seed. Deterministic for a seed: input N of seed S is
// the same on every machine, so a failure's numbers regenerate it.
class Mutator {
 public:
  Mutator(uint64_t seed, const std::vector<Bytes>& pool, size_t max_len)
      : rng_(seed), pool_(pool), max_len_(max_len) {}

  Bytes next() {
    Bytes b = pool_[below(pool_.size())];
    for (size_t n = 1 + below(4); n > 0; --n)
      mutate(b);
    if (b.size() > max_len_) b.resize(max_len_);
    return b;
  }

 private:
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  void mutate(Bytes& b) {
    static const uint8_t kBytes[] = {0,   1,   0x7f, 0x80, 0xff, '0', '9',
                                     '-', '"', '{',  '[',  'e',  '\n'};
    static const uint64_t kIntegers[] = {0,          1,          0x7f,       0xff,
                                         0x7fff,     0xffff,     0x7fffffff, 0x80000000,
                                         0xffffffff, 1ull << 32, 1ull << 62, 0x7fffffffffffffff,
                                         ~0ull,      ~1ull,      1ull << 40};
    static const char* kNumbers[] = {"-1",
                                     "0",
                                     "1e308",
                                     "-1e308",
                                     "99999999999999999999",
                                     "4294967296",
                                     "9223372036854775808",
                                     "nan",
                                     "1.5",
                                     "-0"};
    const size_t at = below(b.size() + 1);
    switch (below(9)) {
      case 0:
        if (!b.empty()) b[below(b.size())] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1:
        if (!b.empty()) b[below(b.size())] = kBytes[below(std::size(kBytes))];
        break;
      case 2:  // drop a range
        b.erase(b.begin() + at, b.begin() + std::min(b.size(), at + 1 + below(16)));
        break;
      case 3: {  // insert random bytes
        Bytes extra(1 + below(16));
        for (auto& x : extra)
          x = static_cast<uint8_t>(rng_());
        b.insert(b.begin() + at, extra.begin(), extra.end());
        break;
      }
      case 4: {  // repeat a range
        const Bytes range(b.begin() + at, b.begin() + std::min(b.size(), at + 1 + below(64)));
        b.insert(b.begin() + below(b.size() + 1), range.begin(), range.end());
        break;
      }
      case 5: {  // the rest from another seed
        const Bytes& other = pool_[below(pool_.size())];
        b.resize(at);
        b.insert(b.end(), other.begin() + below(other.size() + 1), other.end());
        break;
      }
      case 6: {  // an integer at a limit, little-endian, 4 or 8 bytes
        const uint64_t v = kIntegers[below(std::size(kIntegers))];
        const size_t width = below(2) ? 8 : 4;
        for (size_t i = 0; i < width && at + i < b.size(); ++i)
          b[at + i] = static_cast<uint8_t>(v >> (8 * i));
        break;
      }
      case 7: {  // a number in text at a limit
        size_t d = at;
        while (d < b.size() && !(b[d] >= '0' && b[d] <= '9'))
          ++d;
        size_t end = d;
        while (end < b.size() && b[end] >= '0' && b[end] <= '9')
          ++end;
        const std::string n = kNumbers[below(std::size(kNumbers))];
        if (d < b.size()) {
          b.erase(b.begin() + d, b.begin() + end);
          b.insert(b.begin() + d, n.begin(), n.end());
        }
        break;
      }
      default:  // cut short
        b.resize(at);
    }
  }

  std::mt19937_64 rng_;
  const std::vector<Bytes>& pool_;
  size_t max_len_;
};

// What a crash or a hang leaves for the message: the input in flight, written by a signal
// handler with nothing but open/write (async-signal-safe).
struct InFlight {
  const uint8_t* data = nullptr;
  size_t size = 0;
  int64_t number = 0;
  char path[4096] = {0};
  char again[256] = {0};  // "DTORCH_FUZZ_SMOKE_SEED=S DTORCH_FUZZ_SMOKE_REPLAY=", then number
  int err_fd = 2;
};
InFlight g_in_flight;

void on_fatal_signal(int sig) {
  const char* what = sig == SIGALRM ? "fuzz smoke: the input ran past 10 s; it is in "
                                    : "fuzz smoke: the input crashed the harness; it is in ";
  int fd = ::open(g_in_flight.path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ssize_t unused = ::write(fd, g_in_flight.data, g_in_flight.size);
    (void)unused;
    ::close(fd);
  }
  char digits[24];
  size_t d = sizeof digits;
  for (uint64_t v = static_cast<uint64_t>(g_in_flight.number); d == sizeof digits || v > 0; v /= 10)
    digits[--d] = static_cast<char>('0' + v % 10);
  const char* repeat = "\nrepeat it alone: ";
  const int e = g_in_flight.err_fd;
  ssize_t unused = ::write(e, what, std::strlen(what));
  unused = ::write(e, g_in_flight.path, std::strlen(g_in_flight.path));
  unused = ::write(e, repeat, std::strlen(repeat));
  unused = ::write(e, g_in_flight.again, std::strlen(g_in_flight.again));
  unused = ::write(e, digits + d, sizeof digits - d);
  unused = ::write(e, "\n", 1);
  (void)unused;
  ::signal(sig == SIGALRM ? SIGABRT : sig, SIG_DFL);
  ::raise(sig == SIGALRM ? SIGABRT : sig);
}

// The harness's chatter (warnings about skipped samples, thousands of them) goes to
// fuzz-findings/NAME/output.log while it runs; the test's own messages stay on the terminal.
class QuietOutput {
 public:
  explicit QuietOutput(const std::string& log) {
    std::fflush(stdout);
    std::fflush(stderr);
    saved_out_ = ::dup(1);
    saved_err_ = ::dup(2);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    g_in_flight.err_fd = saved_err_;
  }
  ~QuietOutput() {
    std::fflush(stdout);
    std::fflush(stderr);
    ::dup2(saved_out_, 1);
    ::dup2(saved_err_, 2);
    ::close(saved_out_);
    ::close(saved_err_);
    g_in_flight.err_fd = 2;
  }

 private:
  int saved_out_ = -1, saved_err_ = -1;
};

class FuzzSmoke : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzSmoke, SeedsAndMutationsGiveNoFinding) {
  const std::string name = GetParam();
  const Target target = targets().at(name);
  const std::vector<Bytes> seeds = read_seeds(name);
  ASSERT_FALSE(seeds.empty()) << "no seeds for " << name << ": tests/fuzz/make_seeds.sh makes them";
  size_t max_len = 4096;
  for (const Bytes& s : seeds)
    max_len = std::max(max_len, 2 * s.size());

  const std::string findings = paths::join(DTORCH_BINARY_DIR, "fuzz-findings", name);
  paths::create_directories(findings);
  const std::string input_path = paths::join(findings, "input");
  ASSERT_LT(input_path.size(), sizeof g_in_flight.path);
  std::strcpy(g_in_flight.path, input_path.c_str());
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM})
    ::signal(sig, on_fatal_signal);

  const uint64_t seed =
      static_cast<uint64_t>(env_int("DTORCH_FUZZ_SMOKE_SEED", 2));
  const int64_t replay = env_int("DTORCH_FUZZ_SMOKE_REPLAY", 0);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::seconds(env_int("DTORCH_FUZZ_SMOKE_SECONDS", 4));
  const std::string again =
      "DTORCH_FUZZ_SMOKE_SEED=" + std::to_string(seed) + " DTORCH_FUZZ_SMOKE_REPLAY=";
  std::snprintf(g_in_flight.again, sizeof g_in_flight.again, "%s", again.c_str());
  Mutator mutator(seed, seeds, max_len);
  int64_t n = 0;  // inputs 1..seeds.size() are the seeds, then the mutations
  std::string failure;
  {
    QuietOutput quiet(paths::join(findings, "output.log"));
    for (;;) {
      ++n;
      const bool is_seed = n <= static_cast<int64_t>(seeds.size());
      Bytes input = is_seed ? seeds[n - 1] : mutator.next();
      if (replay > 0 && n < replay) continue;
      if (replay == 0 && !is_seed && std::chrono::steady_clock::now() > deadline) break;
      g_in_flight.data = input.data();
      g_in_flight.size = input.size();
      g_in_flight.number = n;
      ::alarm(10);
      try {
        target(input.data(), input.size());
      } catch (const std::exception& e) {
        failure = std::string("an exception escaped: ") + e.what();
      } catch (...) {
        failure = "an exception of unknown type escaped";
      }
      ::alarm(0);
      if (!failure.empty()) {
        std::ofstream(input_path, std::ios::binary)
            .write(reinterpret_cast<const char*>(input.data()),
                   static_cast<std::streamsize>(input.size()));
        break;
      }
      if (replay > 0) break;
    }
  }
  ::signal(SIGALRM, SIG_DFL);
  EXPECT_TRUE(failure.empty()) << name << ": input " << n << " (" << input_path << "): " << failure
                               << "\nrepeat it alone: " << again << n
                               << " dtorch_tests --gtest_filter='*FuzzSmoke*/" << name << "'";
  std::printf("%s: %zu seeds and %lld mutated inputs, mutation seed %llu\n", name.c_str(),
              seeds.size(), static_cast<long long>(n - 1 - static_cast<int64_t>(seeds.size())),
              static_cast<unsigned long long>(seed));
}

// Every harness compiled into the suite, listed when gtest starts (after every file's
// DTORCH_FUZZ_TARGET has registered itself).
std::vector<std::string> target_names() {
  std::vector<std::string> names;
  for (const auto& [name, target] : targets())
    names.push_back(name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Harnesses, FuzzSmoke, ::testing::ValuesIn(target_names()),
                         [](const auto& info) { return info.param; });

TEST(FuzzHarnesses, EveryHarnessFileIsInTheSuite) {
  std::error_code ec;
  size_t files = 0;
  for (const std::string& f :
       paths::list_directory(paths::join(DTORCH_SOURCE_DIR, "tests", "fuzz"), ec)) {
    if (f.size() <= 9 || f.compare(f.size() - 9, 9, "_fuzz.cpp") != 0) continue;
    ++files;
    EXPECT_TRUE(targets().count(f.substr(0, f.size() - 9))) << f << " registers no harness";
  }
  EXPECT_EQ(targets().size(), files);
  EXPECT_GE(files, 14u);
}

}  // namespace
}  // namespace dtorch::fuzz
