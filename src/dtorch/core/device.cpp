// Devices: the GPU each rank uses, its allocator's counts, device-side timing and batch copies
// (device.h). CUDA calls compile only against a CUDA LibTorch (DTORCH_WITH_CUDA); events and
// streams go through c10's device-generic interface, which is the same on every 2.x.
#include "dtorch/core/device.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <cstdlib>
#include <deque>
#include <map>
#include <utility>

#ifdef DTORCH_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "dtorch/core/error.h"

// c10::Event measures time between events from LibTorch 2.4 on; before, a GPU's clock is the
// host's after a synchronize.
#if defined(DTORCH_WITH_CUDA) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))
#define DTORCH_DEVICE_EVENTS 1
#endif

namespace dtorch {
namespace {

std::string visible_devices() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? str("CUDA_VISIBLE_DEVICES='", v, "'") : std::string("CUDA_VISIBLE_DEVICES unset");
}

}  // namespace

CudaAvailability cuda_availability() {
  CudaAvailability a;
#ifdef DTORCH_WITH_CUDA
  a.compiled = true;
  a.visible = static_cast<int>(torch::cuda::device_count());
#endif
  return a;
}

const NameTable<DeviceKind>& names(DeviceKind) {
  static const NameTable<DeviceKind> n{
      {DeviceKind::CPU, "cpu"}, {DeviceKind::CUDA, "cuda"}, {DeviceKind::Auto, "auto"}};
  return n;
}

at::Device resolve_device(DeviceKind spec, int local_rank, int local_world_size,
                          const CudaAvailability& cuda, bool share_gpus, const std::string& flag) {
  if (spec == DeviceKind::CPU ||
      (spec == DeviceKind::Auto && (!cuda.compiled || cuda.visible == 0)))
    return at::kCPU;
  DTORCH_CHECK_T(ConfigError, cuda.compiled, flag,
                 " cuda: this dtorch is built against a LibTorch without CUDA. Build it against "
                 "a CUDA LibTorch: `make build TORCH=pip` (PyPI's torch wheel), or cmake "
                 "-DCMAKE_PREFIX_PATH=<the CUDA LibTorch's folder>; or train with ",
                 flag, " cpu");
  DTORCH_CHECK_T(ConfigError, cuda.visible > 0, flag, " cuda: no GPU is visible to this process (",
                 visible_devices(), "); check nvidia-smi and the job's GPU request, or train with ",
                 flag, " cpu");
  const int ranks = std::max(1, local_world_size);
  DTORCH_CHECK_T(ConfigError, ranks <= cuda.visible || share_gpus, flag, " ", name_of(spec), ": ",
                 ranks, " local ranks but ", cuda.visible, " visible GPU(s) (", visible_devices(),
                 "), and each rank needs a GPU of its own (Note [One GPU per rank]); start at "
                 "most ",
                 cuda.visible, " ranks per node (--nproc-per-node ", cuda.visible,
                 "), make more GPUs visible, or set DTORCH_BACKEND=gloo to let ranks share GPUs "
                 "through host memory (slow; for testing)");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank % cuda.visible));
}

void use_device(at::Device d) {
#ifdef DTORCH_WITH_CUDA
  if (!d.is_cuda()) return;
  c10::cuda::set_device(d.index());
  // CUDA starts lazily: the context and the caching allocator exist from the first tensor on
  // the device, and reading the allocator's counts before that fails ("Invalid device
  // argument ... did you call init?").
  at::empty({1}, at::TensorOptions().device(d));
#endif
}

std::string gpu_name(at::Device d) {
#ifdef DTORCH_WITH_CUDA
  if (d.is_cuda()) return at::cuda::getDeviceProperties(d.index())->name;
#endif
  return d.str();
}

void synchronize(at::Device d) {
#ifdef DTORCH_WITH_CUDA
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
#endif
}

void set_sync_errors(bool on) {
#ifdef DTORCH_WITH_CUDA
  c10::cuda::warning_state().set_sync_debug_mode(on ? c10::cuda::SyncDebugMode::L_ERROR
                                                    : c10::cuda::SyncDebugMode::L_DISABLED);
#else
  (void)on;
#endif
}

DeviceMemory device_memory(at::Device d) {
  DeviceMemory m;
#ifdef DTORCH_WITH_CUDA
  if (!d.is_cuda()) return m;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
  constexpr size_t all = 0;  // StatType::AGGREGATE
  m.allocated = stats.allocated_bytes[all].current;
  m.peak_allocated = stats.allocated_bytes[all].peak;
  m.reserved = stats.reserved_bytes[all].current;
  m.peak_reserved = stats.reserved_bytes[all].peak;
  m.total = static_cast<int64_t>(at::cuda::getDeviceProperties(d.index())->totalGlobalMem);
#endif
  return m;
}

void reset_peak_memory(at::Device d) {
#ifdef DTORCH_WITH_CUDA
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
#endif
}

// ---- DeviceClock -------------------------------------------------------------------------

struct DeviceClock::Impl {
  explicit Impl(at::Device d) : device(d) {}
  at::Device device;
  int64_t first = 0;  // the number of marks.front()
  // On a GPU an event per mark (timing enabled: the backend's default flags); on the CPU the
  // host's time.
  std::deque<c10::Event> events;
  std::deque<std::chrono::steady_clock::time_point> times;
};

DeviceClock::DeviceClock(at::Device d) : impl_(std::make_unique<Impl>(d)) {}
DeviceClock::~DeviceClock() = default;

int64_t DeviceClock::mark() {
  Impl& m = *impl_;
#ifdef DTORCH_DEVICE_EVENTS
  if (m.device.is_cuda()) {
    const auto* guard = c10::impl::getDeviceGuardImpl(m.device.type());
    m.events.emplace_back(m.device.type(), c10::EventFlag::BACKEND_DEFAULT);
    m.events.back().record(guard->getStream(m.device));
    return m.first + static_cast<int64_t>(m.events.size()) - 1;
  }
#endif
  synchronize(m.device);
  m.times.push_back(std::chrono::steady_clock::now());
  return m.first + static_cast<int64_t>(m.times.size()) - 1;
}

double DeviceClock::seconds(int64_t from, int64_t to) {
  Impl& m = *impl_;
  DTORCH_CHECK(from >= m.first && to >= from, "DeviceClock: mark ", from, " is forgotten");
  const auto i = static_cast<size_t>(from - m.first), j = static_cast<size_t>(to - m.first);
#ifdef DTORCH_DEVICE_EVENTS
  if (!m.events.empty()) {
    DTORCH_CHECK(j < m.events.size(), "DeviceClock: no mark ", to);
    m.events[j].synchronize();
    return m.events[i].elapsedTime(m.events[j]) / 1000.0;  // milliseconds
  }
#endif
  DTORCH_CHECK(j < m.times.size(), "DeviceClock: no mark ", to);
  return std::chrono::duration<double>(m.times[j] - m.times[i]).count();
}

void DeviceClock::forget_before(int64_t keep_from) {
  Impl& m = *impl_;
  while (m.first < keep_from && !(m.events.empty() && m.times.empty())) {
    if (!m.events.empty()) m.events.pop_front();
    if (!m.times.empty()) m.times.pop_front();
    ++m.first;
  }
}

// ---- batches to the device -----------------------------------------------------------------

std::vector<at::Tensor> pinned(const std::vector<at::Tensor>& host) {
  if (!cuda_availability().compiled || cuda_availability().visible == 0) return host;
  std::vector<at::Tensor> out;
  for (const auto& t : host)
    out.push_back(t.is_pinned() ? t : t.pin_memory());
  return out;
}

struct DeviceCopier::Impl {
  explicit Impl(at::Device d) : device(d) {}
  at::Device device;
  std::optional<c10::Stream> stream;  // the copies' own stream (GPU only)
  std::optional<c10::Event> copied;   // recorded on it after the last start()
  std::vector<at::Tensor> tensors;
};

DeviceCopier::DeviceCopier(at::Device d) : impl_(std::make_unique<Impl>(d)) {
  if (!d.is_cuda()) return;
  const auto* guard = c10::impl::getDeviceGuardImpl(d.type());
  impl_->stream = guard->getStreamFromGlobalPool(d, /*isHighPriority=*/false);
}

DeviceCopier::~DeviceCopier() = default;

void DeviceCopier::start(std::vector<at::Tensor> host) {
  Impl& m = *impl_;
  if (!m.stream) {
    m.tensors = std::move(host);
    return;
  }
  c10::StreamGuard on_copy_stream(*m.stream);
  m.tensors.clear();
  for (const auto& t : host)
    m.tensors.push_back(t.to(m.device, /*non_blocking=*/t.is_pinned()));
  m.copied.emplace(m.device.type(), c10::EventFlag::PYTORCH_DEFAULT);
  m.copied->record(*m.stream);
}

std::vector<at::Tensor> DeviceCopier::ready() {
  Impl& m = *impl_;
  if (m.stream && m.copied) {
    const auto* guard = c10::impl::getDeviceGuardImpl(m.device.type());
    const c10::Stream compute = guard->getStream(m.device);
    m.copied->block(compute);
    for (auto& t : m.tensors)
      t.record_stream(compute);  // Note [Batches to the GPU]
    m.copied.reset();
  }
  return std::move(m.tensors);
}

struct LateRead::Impl {
  at::Tensor host;
  std::optional<c10::Event> copied;  // recorded after the copy (GPU only)
};

LateRead::LateRead() : impl_(std::make_unique<Impl>()) {}
LateRead::~LateRead() = default;

void LateRead::start(const at::Tensor& t) {
  Impl& m = *impl_;
  m.copied.reset();
#ifdef DTORCH_DEVICE_EVENTS
  if (t.is_cuda()) {
    m.host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    m.host.copy_(t, /*non_blocking=*/true);
    const auto* guard = c10::impl::getDeviceGuardImpl(t.device().type());
    m.copied.emplace(t.device().type(), c10::EventFlag::PYTORCH_DEFAULT);
    m.copied->record(guard->getStream(t.device()));
    return;
  }
#endif
  // The CPU; a GPU before LibTorch 2.4, whose c10::Event cannot be waited for alone.
  m.host = t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

bool LateRead::pending() const {
  return impl_->host.defined();
}

at::Tensor LateRead::take() {
  Impl& m = *impl_;
#ifdef DTORCH_DEVICE_EVENTS
  if (m.copied) m.copied->synchronize();
#endif
  m.copied.reset();
  return std::exchange(m.host, at::Tensor());
}

}  // namespace dtorch
