// Checkpoint files (see Note [Checkpoint format]): framing with length and CRC, the payload as
// a torch.save pickle, atomic replacement, pruning, and newest-good-first recovery.
#include "dtorch/checkpoint/checkpoint.h"

#include <torch/serialize.h>

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <typeinfo>

#include "dtorch/checkpoint/crc32.h"
#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/checkpoint/torch_save.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"
#include "dtorch/models/unit_seeds.h"
#include "dtorch/parallel/optimizer_state.h"

namespace dtorch::checkpoint {
namespace {

constexpr char kMagic[8] = {'D', 'T', 'O', 'R', 'C', 'H', 'C', 'K'};
constexpr size_t kHeaderSize = 8 + 4 + 8 + 4;
const std::string kPrefix = "checkpoint-";
const std::string kSuffix = ".dtc";

// The epoch of a checkpoint file name, or -1 for any other name (temporaries included).
int64_t epoch_of(const std::string& name) {
  if (name.size() <= kPrefix.size() + kSuffix.size()) return -1;
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  if (name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) return -1;
  std::string digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    return -1;
  return std::stoll(digits);
}

void put_le(std::vector<char>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

std::string tensor_to_bytes(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  return std::string(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()), c.numel());
}

// Why a file cannot be used at all (truncated, corrupt, not a checkpoint): the one kind of
// failure load_latest_checkpoint answers by falling back to an older file. It carries no
// file:line, as it ends up inside a message that has one.
class Unusable : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
void require(bool cond, Args&&... args) {
  if (!cond) throw Unusable(str(std::forward<Args>(args)...));
}

// The message of any exception, without the C++ backtrace LibTorch's errors carry.
std::string brief(const std::exception& e) {
  if (auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  return e.what();
}

// "torch::optim::Adam" for an Adam, so a checkpoint can say which optimizer wrote it. A fused
// optimizer is named by the torch::optim class whose state it keeps (Note [Fused optimizers]),
// so checkpoints of either resume with the other.
std::string optimizer_type(const torch::optim::Optimizer& o) {
  if (dynamic_cast<const torch::optim::AdamW*>(&o)) return "torch::optim::AdamW";
  if (dynamic_cast<const torch::optim::Adam*>(&o)) return "torch::optim::Adam";
  if (dynamic_cast<const torch::optim::SGD*>(&o)) return "torch::optim::SGD";
  const char* mangled = typeid(o).name();
  int status = 0;
  char* plain = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = (status == 0 && plain) ? plain : mangled;
  std::free(plain);
  return name;
}

// A checkpoint file read and verified but not yet applied.
struct Parsed {
  CheckpointData data;
  StateDict model;
  std::optional<std::string> optimizer;  // archive bytes; none when saved without one
  std::string optimizer_type;
  torch::Tensor rng_state;
};

// Reads and verifies one file; throws Unusable saying what is wrong with it.
Parsed parse(const std::string& path) {
  std::vector<char> bytes;
  try {
    bytes = read_file(path);
  } catch (const CheckpointError& e) {
    throw Unusable(e.what());
  }
  require(bytes.size() >= kHeaderSize, "truncated: ", bytes.size(), " bytes, shorter than the ",
          kHeaderSize, "-byte header");
  require(std::memcmp(bytes.data(), kMagic, 8) == 0, "bad magic number: not a dtorch checkpoint");
  const uint64_t version = get_le(bytes.data() + 8, 4);
  require(version == kCheckpointVersion, "format version ", version, ", this dtorch reads version ",
          kCheckpointVersion);
  const uint64_t length = get_le(bytes.data() + 12, 8);
  const uint64_t have = bytes.size() - kHeaderSize;
  require(length == have, (have < length ? "truncated" : "padded"), ": header announces ", length,
          " payload bytes, file holds ", have);
  const uint32_t crc = static_cast<uint32_t>(get_le(bytes.data() + 20, 4));
  require(crc == crc32_of(bytes.data() + kHeaderSize, have), "CRC mismatch: the file is corrupt");

  std::vector<char> payload(bytes.begin() + kHeaderSize, bytes.end());
  bytes = {};
  Parsed out;
  // The CRC matched, so a failure below means a writer bug or a foreign file; still, say so
  // rather than crash. toInt() and friends throw c10::Error on a field of the wrong type.
  try {
    c10::IValue root = load_torch_save(payload);
    require(root.isGenericDict(), "payload is not a dict");
    auto dict = root.toGenericDict();
    auto field = [&](const char* key) {
      require(dict.contains(key), "payload lacks \"", key, "\"");
      return dict.at(key);
    };
    out.data.epoch = field("epoch").toInt();
    out.data.global_step = field("global_step").toInt();
    out.data.metadata_json = field("metadata").toStringRef();
    out.rng_state = field("rng_state").toTensor();
    require(out.rng_state.scalar_type() == torch::kUInt8, "rng_state is not a byte tensor");
    c10::IValue opt = field("optimizer");
    if (opt.isTensor()) {
      out.optimizer = tensor_to_bytes(opt.toTensor());
      out.optimizer_type = field("optimizer_type").toStringRef();
      try {
        check_serialize_archive(*out.optimizer);
      } catch (const UnreadableArchive& e) {
        throw Unusable(std::string("its optimizer state ") + e.what());
      }
    }
    for (const auto& e : field("model").toGenericDict())
      out.model.emplace_back(e.key().toStringRef(), e.value().toTensor());
  } catch (const Unusable&) {
    throw;
  } catch (const UnreadableArchive& e) {
    throw Unusable(std::string("its payload ") + e.what());
  } catch (const std::exception& e) {
    throw Unusable("malformed payload: " + brief(e));
  }
  return out;
}

// Restores a verified checkpoint. Everything that can disagree with the running job is
// checked before the model is changed, so a misfit leaves the model as it was.
void apply(const Parsed& p, const std::string& path, torch::nn::Module& model,
           torch::optim::Optimizer* optimizer) {
  check_state_dict(model, p.model, "checkpoint " + path);
  if (optimizer && p.optimizer) {
    const std::string mine = optimizer_type(*optimizer);
    DTORCH_CHECK_T(CheckpointError, p.optimizer_type == mine, "checkpoint ", path,
                   " was written with optimizer ", p.optimizer_type, ", this run uses ", mine,
                   ": resume with the same optimizer, or start afresh in another checkpoint "
                   "directory");
    try {
      std::istringstream in(*p.optimizer);
      // Saved on whatever device it trained on: read on the CPU, then moved to where each
      // parameter is now (checkpoints written on GPUs load on CPUs and the other way).
      torch::serialize::InputArchive archive;
      archive.load_from(in, torch::Device(torch::kCPU));
      optimizer->load(archive);
      parallel::move_state_to_parameters(*optimizer);
    } catch (const std::exception& e) {
      DTORCH_FAIL(CheckpointError, "checkpoint ", path,
                  ": its optimizer state does not fit this optimizer (different parameter "
                  "groups? resume with the same model and optimizer settings): ",
                  brief(e));
    }
  } else if (optimizer) {
    log::warn("checkpoint ", path, " holds no optimizer state; the optimizer starts fresh");
  }
  load_state_dict(model, p.model, "checkpoint " + path);
  models::set_cpu_generator_state(p.rng_state);
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t epoch) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%06lld%s", kPrefix.c_str(), static_cast<long long>(epoch),
                kSuffix.c_str());
  return paths::join(dir, name);
}

int64_t checkpoint_epoch(const std::string& path) {
  return epoch_of(paths::file_name(path));
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;  // no folder, or an unreadable one: no checkpoints
  for (const std::string& name : paths::list_directory(dir, ec)) {
    const std::string path = paths::join(dir, name);
    int64_t epoch = epoch_of(name);
    if (epoch >= 0 && paths::is_regular_file(path)) found.emplace_back(epoch, path);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<std::string> out;
  for (auto& f : found)
    out.push_back(std::move(f.second));
  return out;
}

void save_checkpoint(const std::string& dir, const CheckpointData& data,
                     const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
                     int keep) {
  write_checkpoint_file(dir, checkpoint_file(checkpoint_state(data, model, optimizer, false)),
                        keep);
}

CheckpointState checkpoint_state(const CheckpointData& data, const torch::nn::Module& model,
                                 const torch::optim::Optimizer* optimizer, bool copy) {
  DTORCH_CHECK_T(CheckpointError, data.epoch >= 0, "checkpoint epoch is ", data.epoch);
  nlohmann::json meta = nlohmann::json::parse(data.metadata_json, nullptr, false);
  DTORCH_CHECK_T(CheckpointError, !meta.is_discarded() && meta.is_object(),
                 "checkpoint metadata must be a JSON object, got: ", data.metadata_json);
  CheckpointState out{data, host_copy(state_dict(model), copy), nullptr,
                      models::cpu_generator_state()};
  if (optimizer && copy) {
    out.optimizer = parallel::snapshot_optimizer(
        *optimizer, [](const torch::Tensor& t) { return host_snapshot(t); });
  } else if (optimizer) {
    out.optimizer = std::shared_ptr<const torch::optim::Optimizer>(
        optimizer, [](const torch::optim::Optimizer*) {});
  }
  return out;
}

CheckpointFile checkpoint_file(const CheckpointState& state) {
  const CheckpointData& data = state.data;
  const torch::optim::Optimizer* optimizer = state.optimizer.get();
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  c10::Dict<std::string, torch::Tensor> params;
  for (const auto& [name, tensor] : state.model)
    params.insert(name, tensor);
  dict.insert("model", params);
  if (optimizer) {
    torch::serialize::OutputArchive archive;
    // Serializing only reads the optimizer (LibTorch's save is not const).
    auto& opt = const_cast<torch::optim::Optimizer&>(*optimizer);
    opt.save(archive);
    // The archive's bytes become the tensor's storage as they are, without a copy.
    auto bytes = std::make_shared<std::vector<char>>();
    bytes->reserve(static_cast<size_t>(parallel::state_bytes(opt)) + (1 << 20));
    archive.save_to([&bytes](const void* data, size_t n) {
      const char* p = static_cast<const char*>(data);
      bytes->insert(bytes->end(), p, p + n);
      return n;
    });
    dict.insert("optimizer", torch::from_blob(
                                 bytes->data(), {static_cast<int64_t>(bytes->size())},
                                 [bytes](void*) {}, torch::TensorOptions().dtype(torch::kUInt8)));
    dict.insert("optimizer_type", optimizer_type(*optimizer));
  } else {
    dict.insert("optimizer", c10::IValue());
  }
  dict.insert("epoch", data.epoch);
  dict.insert("global_step", data.global_step);
  dict.insert("rng_state", state.rng_state);
  dict.insert("metadata", data.metadata_json);
  // The header, then the payload appended after it; its size and checksum are filled in last.
  CheckpointFile out{data.epoch, std::vector<char>(kMagic, kMagic + 8)};
  std::vector<char>& file = out.bytes;
  put_le(file, kCheckpointVersion, 4);
  put_le(file, 0, 8);  // payload size
  put_le(file, 0, 4);  // its CRC-32, the payload's only one (Note [One checksum per file])
  append_torch_save(c10::IValue(dict), file, RecordCrcs::LeftOut);
  const size_t payload = file.size() - kHeaderSize;
  std::vector<char> sizes;
  put_le(sizes, payload, 8);
  put_le(sizes, crc32_of(file.data() + kHeaderSize, payload), 4);
  std::copy(sizes.begin(), sizes.end(), file.begin() + 12);
  return out;
}

void write_checkpoint_file(const std::string& dir, const CheckpointFile& file, int keep) {
  DTORCH_CHECK_T(ConfigError, keep >= 1, "checkpoints to keep is ", keep, ", must be >= 1");
  std::error_code ec;
  paths::create_directories(dir, ec);
  DTORCH_CHECK_T(CheckpointError, paths::is_directory(dir), "cannot create checkpoint directory ",
                 dir, ": ", ec.message(),
                 " (save into a writable directory: `dtorch train --out DIR`)");
  const std::string path = checkpoint_path(dir, file.epoch);
  write_file_atomically(path, file.bytes);

  // Prune only after the new file is safely in place; never the file just written, even
  // when the directory holds newer epochs from an earlier run.
  std::vector<std::string> all = list_checkpoints(dir);
  if (!all.empty() && all.front() != path) {
    log::warn("checkpoint directory ", dir, " holds ", all.front(), ", newer than ", path,
              " just written; resuming will pick the newer one (give each run its own "
              "directory: `dtorch train --out DIR`)");
  }
  int others_kept = 0;
  for (const auto& f : all) {
    if (f == path) continue;
    if (others_kept < keep - 1) {
      ++others_kept;
      continue;
    }
    if (!paths::remove(f, ec)) log::warn("could not delete old checkpoint ", f, ": ", ec.message());
  }
}

LoadedCheckpoint load_checkpoint(const std::string& path, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer) {
  Parsed p;
  try {
    p = parse(path);
  } catch (const Unusable& e) {
    DTORCH_FAIL(CheckpointError, "checkpoint ", path, " is unusable: ", e.what());
  }
  apply(p, path, model, optimizer);
  return {p.data, path};
}

std::pair<StateDict, CheckpointData> read_checkpoint_model(const std::string& path) {
  try {
    Parsed p = parse(path);
    return {std::move(p.model), p.data};
  } catch (const Unusable& e) {
    DTORCH_FAIL(CheckpointError, "checkpoint ", path, " is unusable: ", e.what());
  }
}

std::optional<LoadedCheckpoint> load_latest_checkpoint(const std::string& dir,
                                                       torch::nn::Module& model,
                                                       torch::optim::Optimizer* optimizer,
                                                       std::optional<int64_t> at_most) {
  std::vector<std::string> files = list_checkpoints(dir);
  if (at_most) {
    files.erase(
        std::remove_if(files.begin(), files.end(),
                       [&](const std::string& f) { return checkpoint_epoch(f) > *at_most; }),
        files.end());
  }
  if (files.empty()) return std::nullopt;
  std::string failures;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& f = files[i];
    Parsed p;
    try {
      p = parse(f);
    } catch (const Unusable& e) {
      log::warn("checkpoint ", f, " is unusable (", e.what(), ")",
                i + 1 < files.size() ? "; falling back to the previous one" : "");
      failures += str("\n  ", f, ": ", e.what());
      continue;
    }
    apply(p, f, model, optimizer);
    log::info("resumed from checkpoint ", f, " (epoch ", p.data.epoch, ", step ",
              p.data.global_step, ")");
    return LoadedCheckpoint{p.data, f};
  }
  DTORCH_FAIL(CheckpointError, "no checkpoint in ", dir, " is readable:", failures,
              "\nDelete them (or train into another directory: `dtorch train --out DIR`) to start "
              "from scratch.");
}

}  // namespace dtorch::checkpoint
