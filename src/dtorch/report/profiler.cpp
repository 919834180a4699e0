// `--profile`: LibTorch's Kineto profiler over a range of steps (see profiler.h).
#include "dtorch/report/profiler.h"

#include <sys/stat.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/version.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <regex>
#include <set>

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"

namespace dtorch::report {
namespace {

namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

ProfilerConfig config() {
  return ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/false,
                        /*profile_memory=*/false, /*with_stack=*/false);
}

std::set<ActivityType> activities(c10::Device device) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (device.is_cuda()) a.insert(ActivityType::CUDA);
  return a;
}

void start(c10::Device device) {
  kineto::prepareProfiler(config(), activities(device));
  kineto::enableProfiler(config(), activities(device));
}

// Stops the profiler and writes what it traced to `path`, replacing it whole: Kineto writes a
// file of its own beside it, which then takes the path's name.
void stop_and_save(const std::string& path) {
  std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
  const std::string partial = path + ".partial." + std::to_string(getpid());
  try {
    result->save(partial);
  } catch (const std::exception& e) {
    std::remove(partial.c_str());
    DTORCH_FAIL(CheckpointError, "--profile: cannot write the trace ", path, ": ",
                first_line(e.what()));
  }
  struct stat written {};
  const bool wrote = stat(partial.c_str(), &written) == 0 && written.st_size > 0;
  if (!wrote) std::remove(partial.c_str());
  DTORCH_CHECK_T(CheckpointError, wrote, "--profile: the profiler wrote no trace to ", partial,
                 " (is the folder writable?)");
  // Like every file dtorch writes, it replaces a regular file only (core/atomic_file.h).
  struct stat there {};
  const bool other = lstat(path.c_str(), &there) == 0 && !S_ISREG(there.st_mode);
  if (other) std::remove(partial.c_str());
  DTORCH_CHECK_T(CheckpointError, !other, "--profile: ", path,
                 " exists and is not a regular file; give --out another folder");
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(partial.c_str());
    DTORCH_FAIL(CheckpointError, "--profile: cannot write the trace ", path, ": ", why);
  }
}

}  // namespace

StepRange parse_step_range(const std::string& spec, const std::string& flag) {
  if (spec.empty()) return {};
  static const std::regex form(R"(\s*(\d{1,12})\s*:\s*(\d{1,12})\s*)");
  std::smatch m;
  StepRange r;
  if (std::regex_match(spec, m, form)) r = {std::stoll(m[1].str()), std::stoll(m[2].str())};
  DTORCH_CHECK_T(ConfigError, r.first >= 1 && r.last >= r.first, flag, " '", spec,
                 "': give the optimizer steps to trace as FIRST:LAST, with 1 <= FIRST <= LAST "
                 "(e.g. ",
                 flag, " 5:7 traces steps 5, 6 and 7)");
  return r;
}

std::string trace_path(const std::string& folder, int rank) {
  return (folder.empty() ? std::string(".") : folder) + "/trace.rank" + std::to_string(rank) +
         ".json";
}

void require_profiler() {
  char dir[] = "/tmp/dtorch-profile-XXXXXX";
  DTORCH_CHECK_T(ConfigError, mkdtemp(dir) != nullptr,
                 "--profile: cannot make a scratch folder in /tmp to try the profiler");
  const std::string probe = std::string(dir) + "/probe.json";
  std::string why;
  try {
    start(c10::Device(c10::kCPU));
    kineto::disableProfiler()->save(probe);
  } catch (const std::exception& e) {
    why = first_line(e.what());
  }
  std::remove(probe.c_str());
  rmdir(dir);
  DTORCH_CHECK_T(ConfigError, why.empty(),
                 "--profile needs a LibTorch built with the Kineto "
                 "profiler, and this one (",
                 TORCH_VERSION, ") cannot write a trace (", why,
                 "): build dtorch against PyPI's torch 2.x (make TORCH=pip), or leave "
                 "--profile out");
}

StepProfiler::StepProfiler(StepRange range, std::string path, c10::Device device)
    : range_(range), path_(std::move(path)), device_(device) {}

StepProfiler::~StepProfiler() {
  if (!running_) return;
  try {
    kineto::disableProfiler();  // the run ended before the range did: nothing is written
  } catch (...) {
  }
}

void StepProfiler::before_step(int64_t step) {
  if (running_ || range_.empty() || step != range_.first) return;
  start(device_);
  running_ = true;
}

bool StepProfiler::after_step(int64_t step) {
  if (!running_ || step != range_.last) return false;
  running_ = false;
  stop_and_save(path_);
  log::info("--profile: steps ", range_.first, " to ", range_.last, " traced in ", path_,
            " (open it at ui.perfetto.dev or chrome://tracing)");
  return true;
}

}  // namespace dtorch::report
