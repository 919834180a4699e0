// State dicts in torch.save's format or safetensors, plus the atomic file write that every
// dtorch output shares: a crash mid-write must never destroy the previous good file.
#include "dtorch/checkpoint/state_dict.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/serialize.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "dtorch/checkpoint/safetensors.h"
#include "dtorch/checkpoint/torch_save.h"
#include "dtorch/core/atomic_file.h"
#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"
#include "dtorch/core/paths.h"

namespace dtorch::checkpoint {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

std::string shape_text(const torch::Tensor& t) {
  return str(t.sizes());
}

}  // namespace

StateDict state_dict(const torch::nn::Module& module) {
  StateDict out;
  for (const auto& kv : module.named_parameters(/*recurse=*/true))
    out.emplace_back(kv.key(), kv.value().detach());
  for (const auto& kv : module.named_buffers(/*recurse=*/true))
    out.emplace_back(kv.key(), kv.value().detach());
  return out;
}

StateDict host_copy(const StateDict& state, bool snapshot) {
  std::map<const c10::TensorImpl*, torch::Tensor> copied;
  StateDict out;
  for (const auto& [name, t] : state) {
    if (!t.defined() || (t.device().is_cpu() && !snapshot)) {
      out.emplace_back(name, t);
      continue;
    }
    auto it = copied.find(t.unsafeGetTensorImpl());
    if (it == copied.end()) {
      it = copied.emplace(t.unsafeGetTensorImpl(), snapshot ? host_snapshot(t) : t.cpu()).first;
    }
    out.emplace_back(name, it->second);
  }
  return out;
}

torch::Tensor host_snapshot(const torch::Tensor& t) {
  if (t.device().is_cpu()) return t.clone();
  auto host = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
  host.copy_(t);
  return host;
}

StateDict with_python_aliases(StateDict state, const std::vector<models::PythonAlias>& aliases) {
  for (const auto& a : aliases) {
    auto has = [&](const std::string& key) {
      return std::any_of(state.begin(), state.end(),
                         [&](const auto& kv) { return kv.first == key; });
    };
    if (has(a.alias)) continue;
    auto it = std::find_if(state.begin(), state.end(),
                           [&](const auto& kv) { return kv.first == a.name; });
    if (it != state.end()) state.insert(it + 1, {a.alias, it->second});
  }
  return state;
}

namespace {

// The state without the Python aliases of `module` (when it is a dtorch model); an alias must
// hold its parameter's values.
StateDict without_python_aliases(const torch::nn::Module& module, const StateDict& state,
                                 const std::string& source) {
  const auto* model = dynamic_cast<const models::Model*>(&module);
  if (!model) return state;
  std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
  std::set<std::string> drop;
  for (const auto& a : model->python_aliases()) {
    auto alias = by_name.find(a.alias), name = by_name.find(a.name);
    if (alias == by_name.end() || name == by_name.end()) continue;
    DTORCH_CHECK_T(CheckpointError,
                   alias->second.sizes().equals(name->second.sizes()) &&
                       torch::equal(alias->second, name->second),
                   source, ": ", a.alias, " differs from ", a.name,
                   ", which this model ties to it (one tensor): the weights in the file were not "
                   "tied; load them into an untied model instead");
    drop.insert(a.alias);
  }
  if (drop.empty()) return state;
  StateDict out;
  for (const auto& kv : state)
    if (!drop.count(kv.first)) out.push_back(kv);
  return out;
}

}  // namespace

int64_t elements_within(const std::vector<int64_t>& shape, int64_t limit) {
  int64_t n = 1;
  for (const int64_t s : shape) {
    if (s < 0 || (s > 0 && n > limit / s)) return -1;
    n *= s;
  }
  return n;
}

namespace {

c10::IValue as_dict(const StateDict& state) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& [name, tensor] : host_copy(state))
    dict.insert(name, tensor);
  return dict;
}

}  // namespace

std::vector<char> pickle_state_dict(const StateDict& state) {
  return torch_save_bytes(as_dict(state));
}

void stream_state_dict(const StateDict& state, const ByteSink& sink, RecordCrcs crcs) {
  stream_torch_save(as_dict(state), sink, crcs);
}

namespace {

// The dict of tensors `load` reads from `source`, each failure a CheckpointError naming it.
StateDict unpickle_with(const std::function<c10::IValue()>& load, const std::string& source) {
  c10::IValue value;
  try {
    value = load();
  } catch (const UnreadableArchive& e) {
    DTORCH_FAIL(CheckpointError, source, " is not a readable state dict: it ", e.what());
  } catch (const c10::Error& e) {
    // 1.13's C++ unpickler cannot rebuild the OrderedDict (with its _metadata attribute)
    // that Python's Module.state_dict() returns; a plain dict of the same items loads.
    DTORCH_FAIL(CheckpointError, source,
                " is not a readable state dict: ", e.what_without_backtrace(),
                ". If Python wrote it, save a plain dict: "
                "torch.save(dict(model.state_dict()), path)");
  } catch (const std::exception& e) {
    DTORCH_FAIL(CheckpointError, source, " is not a readable state dict: ", e.what());
  }
  DTORCH_CHECK_T(CheckpointError, value.isGenericDict(), source,
                 " does not hold a dict of tensors (found ", value.tagKind(),
                 "); save it with torch.save(model.state_dict(), path)");
  StateDict out;
  for (const auto& entry : value.toGenericDict()) {
    DTORCH_CHECK_T(CheckpointError, entry.key().isString() && entry.value().isTensor(), source,
                   " holds an entry that is not name -> tensor (", entry.key().tagKind(), " -> ",
                   entry.value().tagKind(), ")");
    out.emplace_back(entry.key().toStringRef(), entry.value().toTensor());
  }
  return out;
}

}  // namespace

StateDict unpickle_state_dict(const std::vector<char>& bytes, const std::string& source) {
  return unpickle_with([&] { return load_torch_save(bytes); }, source);
}

StateDict unpickle_state_dict(const MappedFile& file, const std::string& source) {
  return unpickle_with([&] { return load_torch_save_in_place(file.bytes, file.size); }, source);
}

void check_state_dict(const torch::nn::Module& module, const StateDict& with_aliases,
                      const std::string& source) {
  const StateDict state = without_python_aliases(module, with_aliases, source);
  std::map<std::string, torch::Tensor> given(state.begin(), state.end());
  std::vector<std::string> missing, mismatched;
  std::set<std::string> expected;
  for (const auto& [name, tensor] : state_dict(module)) {
    expected.insert(name);
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
    } else if (!it->second.sizes().equals(tensor.sizes())) {
      mismatched.push_back(
          str(name, " (saved ", shape_text(it->second), ", model ", shape_text(tensor), ")"));
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : state)
    if (!expected.count(name)) unexpected.push_back(name);
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return;

  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 10; ++i)
      s += (i ? ", " : "") + v[i];
    if (v.size() > 10) s += str(", ... (", v.size(), " in all)");
    return s;
  };
  std::string msg = str(source, " does not fit this model (was it saved from a different model?):");
  if (!missing.empty()) msg += " missing keys: " + join(missing) + ";";
  if (!unexpected.empty()) msg += " unexpected keys: " + join(unexpected) + ";";
  if (!mismatched.empty()) msg += " shape mismatches: " + join(mismatched) + ";";
  DTORCH_FAIL(CheckpointError, msg);
}

void load_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& source) {
  check_state_dict(module, state, source);
  std::map<std::string, torch::Tensor> given(state.begin(), state.end());
  torch::NoGradGuard no_grad;
  for (auto& kv : module.named_parameters(true))
    kv.value().copy_(given.at(kv.key()));
  for (auto& kv : module.named_buffers(true))
    kv.value().copy_(given.at(kv.key()));
}

const NameTable<SaveFormat>& names(SaveFormat) {
  static const NameTable<SaveFormat> n{{SaveFormat::Torch, "pt"},
                                       {SaveFormat::Safetensors, "safetensors"}};
  return n;
}

std::string file_suffix(SaveFormat format) {
  return format == SaveFormat::Safetensors ? ".safetensors" : ".pt";
}

std::vector<char> serialize_state_dict(const StateDict& state, SaveFormat format) {
  return format == SaveFormat::Safetensors ? safetensors_bytes(state) : pickle_state_dict(state);
}

StateDict shapes_of(const StateDict& state) {
  std::map<const c10::TensorImpl*, torch::Tensor> made;
  StateDict out;
  for (const auto& [name, t] : state) {
    auto it = made.find(t.unsafeGetTensorImpl());
    if (it == made.end())
      it = made.emplace(t.unsafeGetTensorImpl(),
                        torch::empty(t.sizes(), t.options().device(torch::kMeta)))
               .first;
    out.emplace_back(name, it->second);
  }
  return out;
}

void stream_state_dict(const StateDict& shapes, SaveFormat format,
                       const std::function<void(const TakeTensor&)>& fill, const ByteSink& sink) {
  // Storage k of the file: the k-th distinct tensor (torch.save's), or the k-th entry.
  const bool torch_save = format == SaveFormat::Torch;
  std::map<std::string, size_t> key;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& [name, t] : shapes)
    if (!torch_save || seen.insert(t.unsafeGetTensorImpl()).second) key.emplace(name, key.size());
  const StorageStream storages = [&](const TakeStorage& take) {
    fill([&](const std::string& name, const torch::Tensor& values) {
      auto it = key.find(name);
      if (it == key.end()) throw std::logic_error(str("\"", name, "\" is not an entry to hand"));
      take(it->second, values.detach().to(torch::kCPU).contiguous());
    });
  };
  if (torch_save)
    stream_torch_save_dict(shapes, storages, sink);
  else
    stream_safetensors(shapes, storages, sink);
}

void save_state_dict(const torch::nn::Module& module, const std::string& path, SaveFormat format) {
  StateDict state = state_dict(module);
  const auto* model = dynamic_cast<const models::Model*>(&module);
  if (model && format == SaveFormat::Torch)
    state = with_python_aliases(state, model->python_aliases());
  write_file_atomically(path, serialize_state_dict(state, format));
}

void load_state_dict(torch::nn::Module& module, const std::string& path) {
  std::vector<char> bytes = read_file(path);
  StateDict state = looks_like_safetensors(bytes) ? parse_safetensors(bytes, path)
                                                  : unpickle_state_dict(bytes, path);
  load_state_dict(module, state, path);
}

void write_file_atomically(const std::string& path, const std::vector<char>& bytes) {
  if (auto why = dtorch::write_file_atomically(path, bytes.data(), bytes.size()))
    DTORCH_FAIL(CheckpointError, *why);
}

std::vector<char> read_file(const std::string& path) {
  std::vector<char> out;
  std::error_code ec;
  out.reserve(static_cast<size_t>(paths::file_size(path, ec)));  // 0 when it cannot tell
  read_file_in_pieces(path,
                      [&](const char* data, size_t n) { out.insert(out.end(), data, data + n); });
  return out;
}

namespace {

// The file opened for reading, its size in *size; CheckpointError naming it when it cannot be.
int open_for_reading(const std::string& path, uint64_t* size) {
  std::string problem;
  const int fd = open_input_file(path, kAnySize, size, &problem);
  DTORCH_CHECK_T(CheckpointError, fd >= 0, path, ": ", problem);
  return fd;
}

}  // namespace

uint64_t read_file_in_pieces(const std::string& path,
                             const std::function<void(const char*, size_t)>& each) {
  uint64_t size = 0;
  const int fd = open_for_reading(path, &size);
  std::vector<char> buf(
      static_cast<size_t>(std::min<uint64_t>(std::max<uint64_t>(size, 1), 4 << 20)));
  uint64_t total = 0;
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::string why = errno_text();
      ::close(fd);
      DTORCH_FAIL(CheckpointError, "cannot read ", path, ": ", why);
    }
    if (r == 0) break;
    try {
      each(buf.data(), static_cast<size_t>(r));
    } catch (...) {
      ::close(fd);
      throw;
    }
    total += static_cast<uint64_t>(r);
  }
  ::close(fd);
  return total;
}

MappedFile map_file(const std::string& path) {
  uint64_t size = 0;
  const int fd = open_for_reading(path, &size);
  MappedFile file;
  file.size = static_cast<size_t>(size);
  void* p =
      size == 0 ? nullptr : ::mmap(nullptr, file.size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const std::string why = errno_text();
  ::close(fd);  // the mapping keeps the file
  DTORCH_CHECK_T(CheckpointError, p != MAP_FAILED, "cannot map ", path, " into memory: ", why);
  file.bytes = std::shared_ptr<char>(static_cast<char*>(p), [n = file.size](char* q) {
    if (q) ::munmap(q, n);
  });
  return file;
}

}  // namespace dtorch::checkpoint
