// ZeRO-3's master shards in a mapped file (Note [Parameters on disk] in param_offload.h).
#include "dtorch/parallel/zero/param_offload.h"

#include <ATen/Functions.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtorch/core/error.h"
#include "dtorch/parallel/zero/offload_file.h"

namespace dtorch::zero {

struct ParamOffload::Impl {
  std::vector<int64_t> numels;
  std::vector<size_t> first, bytes;  // per slot: its offset, its whole pages
  size_t file_size = 0;
  int fd = -1;
  std::string path, dir;
  std::shared_ptr<char> base;  // the mapping; every slot's tensor holds it too

  void advise(size_t k, int advice) const {
    if (bytes[k] == 0) return;
    // Advice only: a failure leaves the pages where they are, and the run correct.
    ::madvise(base.get() + first[k], bytes[k], advice);
  }
};

ParamOffload::ParamOffload(const std::vector<int64_t>& numels, const OffloadOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.numels = numels;
  for (int64_t n : numels) {
    m.first.push_back(m.file_size);
    m.bytes.push_back(offload_file::aligned(static_cast<size_t>(n) * sizeof(float)));
    m.file_size += m.bytes.back();
  }
  // Mapped, not read with O_DIRECT: the kernel pages it, and its cache is dropped per step.
  offload_file::Made made =
      offload_file::make(options.dir, options.name, m.file_size, /*direct=*/false,
                         "this rank's share of the parameters");
  m.fd = made.fd;
  m.path = std::move(made.path);
  m.dir = options.dir;
  if (m.file_size == 0) return;
  void* p = ::mmap(nullptr, m.file_size, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(m.fd);
    DTORCH_FAIL(ConfigError, "cannot map the parameters' offload file ", m.path, " (", m.file_size,
                " bytes) into memory: ", std::strerror(err));
  }
  m.base =
      std::shared_ptr<char>(static_cast<char*>(p), [n = m.file_size](char* q) { ::munmap(q, n); });
}

ParamOffload::~ParamOffload() {
  if (impl_->fd >= 0) ::close(impl_->fd);  // the mapping stays while a slot's tensor does
}

at::Tensor ParamOffload::slot(size_t k) const {
  const Impl& m = *impl_;
  if (m.numels.at(k) == 0) return at::zeros({0}, at::kFloat);
  return at::from_blob(
      m.base.get() + m.first[k], {m.numels[k]}, [keep = m.base](void*) {},
      at::TensorOptions().dtype(at::kFloat));
}

void ParamOffload::evict(size_t k) {
  const Impl& m = *impl_;
  m.advise(k, MADV_DONTNEED);  // shared: the changes stay in the file's pages
  if (m.bytes[k] != 0) {
    ::sync_file_range(m.fd, static_cast<off_t>(m.first[k]), static_cast<off_t>(m.bytes[k]),
                      SYNC_FILE_RANGE_WRITE);
  }
}

void ParamOffload::read_ahead(size_t k) {
  impl_->advise(k, MADV_WILLNEED);
}

void ParamOffload::evict_all() {
  const Impl& m = *impl_;
  if (m.file_size == 0) return;
  ::madvise(m.base.get(), m.file_size, MADV_DONTNEED);
  // Starts writing what is dirty and drops what is clean.
  ::posix_fadvise(m.fd, 0, 0, POSIX_FADV_DONTNEED);
}

std::function<at::Tensor(const at::Tensor&)> ParamOffload::snapshot() {
  const Impl& m = *impl_;
  std::shared_ptr<char> kept =
      offload_file::copy_and_map(m.fd, m.file_size, m.path, m.dir, "parameter offload");
  return [kept, base = m.base.get(), n = m.file_size](const at::Tensor& t) {
    char* p = t.defined() ? static_cast<char*>(t.data_ptr()) : nullptr;
    if (!kept || p < base || p >= base + n) return at::Tensor();
    return at::from_blob(
        kept.get() + (p - base), t.sizes(), t.strides(), [kept](void*) {}, t.options());
  };
}

int64_t ParamOffload::file_bytes() const {
  return static_cast<int64_t>(impl_->file_size);
}

const std::string& ParamOffload::path() const {
  return impl_->path;
}

}  // namespace dtorch::zero
