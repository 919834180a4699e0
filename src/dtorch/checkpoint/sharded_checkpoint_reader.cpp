// The sharded checkpoint reader (Note [Sharded checkpoint format] in sharded_checkpoint.h): checks
// metadata.json, reassembles any range of a flat tensor at any world size from the ranks' files,
// verifies the files against their sizes and CRCs, and cuts units back into parameters.
#include "dtorch/checkpoint/sharded_checkpoint.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "dtorch/checkpoint/crc32.h"
#include "dtorch/checkpoint/sharded_files.h"
#include "dtorch/core/error.h"
#include "dtorch/core/json_config.h"
#include "dtorch/core/paths.h"

namespace dtorch::checkpoint {
namespace {

using json = nlohmann::json;

const std::string kDamaged =
    "fall back to an older step directory (delete this one, or pass an older one) or re-run "
    "the save";

// What is wrong with `path` against its recorded size and CRC ("" when nothing), read in pieces
// (a shard of gigabytes is never held whole).
std::string file_problem(const std::string& path, int64_t expect_bytes, uint32_t expect_crc,
                         int64_t* actual) {
  *actual = -1;
  if (!paths::is_regular_file(path)) return "missing";
  uint32_t crc = crc32_of(nullptr, 0);
  try {
    *actual = static_cast<int64_t>(read_file_in_pieces(
        path, [&](const char* data, size_t n) { crc = crc32_update(crc, data, n); }));
  } catch (const CheckpointError& e) {
    return e.what();
  }
  if (*actual != expect_bytes)
    return str(*actual < expect_bytes ? "truncated" : "too long", ": ", *actual,
               " bytes, metadata.json records ", expect_bytes);
  if (crc != expect_crc) return "CRC32 mismatch: the file is corrupt";
  return "";
}

template <typename T>
T field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) throw std::runtime_error(str("lacks \"", key, "\""));
  if constexpr (std::is_integral_v<T>) {
    return json_config::whole_number<T>(j.at(key), str("\"", key, "\""));
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    const json& list = j.at(key);
    if (!list.is_array()) throw std::runtime_error(str("\"", key, "\" is not a list"));
    std::vector<int64_t> out;
    for (const auto& v : list)
      out.push_back(json_config::whole_number<int64_t>(v, str("an entry of \"", key, "\"")));
    return out;
  } else {
    return j.at(key).get<T>();
  }
}

}  // namespace

// ---- reader ----------------------------------------------------------------------------------

struct ShardedCheckpointReader::Impl {
  std::string dir;
  int version = 0;
  int world = 0;
  ShardedCheckpointData data;
  std::map<std::string, FlatTensorInfo> flat;
  std::map<std::string, FullTensorInfo> full;
  std::map<std::string, std::pair<int64_t, uint32_t>> files;  // name -> bytes, crc32
  std::map<std::string, std::map<std::string, torch::Tensor>> loaded;
  std::set<std::string> whole;  // files check_files() found whole: not read again to load

  std::string path_of(const std::string& file) const { return paths::join(dir, file); }

  void parse_metadata();
  const std::map<std::string, torch::Tensor>& load(const std::string& file);
};

void ShardedCheckpointReader::Impl::parse_metadata() {
  const std::string path = path_of(kMetadata);
  DTORCH_CHECK_T(CheckpointError, paths::exists(path), "checkpoint ", dir, " is incomplete: ", path,
                 " is missing, so the save that wrote it did not finish; ", kDamaged);
  std::vector<char> bytes = read_file(path);
  json m;
  std::string why;
  DTORCH_CHECK_T(
      CheckpointError,
      json_config::try_parse(std::string(bytes.begin(), bytes.end()), &m, &why) && m.is_object(),
      path, " is not valid JSON", why.empty() ? "" : " (" + why + ")",
      " (interrupted write or damaged file); ", kDamaged);
  try {
    DTORCH_CHECK_T(CheckpointError, field<std::string>(m, "format") == kFormat, path,
                   " is not the metadata of a dtorch sharded checkpoint");
    version = field<int>(m, "version");
    DTORCH_CHECK_T(CheckpointError, version == kShardedCheckpointVersion, path,
                   " has format version ", version, ", this dtorch reads version ",
                   kShardedCheckpointVersion, ": read it with the dtorch that wrote it");
    world = field<int>(m, "world_size");
    if (world < 1) throw std::runtime_error("world_size < 1");
    data.epoch = field<int64_t>(m, "epoch");
    data.global_step = field<int64_t>(m, "global_step");
    data.metadata_json = m.at("metadata").dump();
    for (const auto& [unit, entries] : m.at("layouts").items()) {
      auto& layout = data.layouts[unit];
      for (const auto& e : entries)
        layout.push_back({field<std::string>(e, "name"), field<std::vector<int64_t>>(e, "shape"),
                          field<int64_t>(e, "offset")});
    }
    // A flat tensor's elements are in the shard files, so no more than the bytes recorded for
    // them hold: checked here, before read_range allocates a tensor of that many.
    int64_t file_bytes = 0;
    for (const auto& [name, f] : m.at("files").items())
      file_bytes = std::min(
          file_bytes + std::clamp<int64_t>(field<int64_t>(f, "bytes"), 0, int64_t{1} << 50),
          int64_t{1} << 60);
    for (const auto& [key, k] : m.at("flat").items()) {
      FlatTensorInfo info;
      info.numel = field<int64_t>(k, "numel");
      if (info.numel < 0) throw std::runtime_error(str("\"", key, "\" has numel ", info.numel));
      auto dtype = dtype_from_name(field<std::string>(k, "dtype"));
      if (!dtype) throw std::runtime_error("unknown dtype for " + key);
      info.dtype = *dtype;
      const auto item = static_cast<int64_t>(c10::elementSize(info.dtype));
      if (elements_within({info.numel}, file_bytes / item) < 0)
        throw std::runtime_error(str("\"", key, "\" has numel ", info.numel, ", more than the ",
                                     file_bytes, " bytes of its files hold"));
      for (const auto& r : k.at("ranges"))
        info.ranges.emplace_back(json_config::whole_number<int64_t>(r.at(0), "a range's begin"),
                                 json_config::whole_number<int64_t>(r.at(1), "a range's end"));
      if (static_cast<int>(info.ranges.size()) != world)
        throw std::runtime_error(
            str("\"", key, "\" has ", info.ranges.size(), " ranges for ", world, " ranks"));
      for (const auto& [b, e] : info.ranges)
        if (b < 0 || e < b || e > info.numel)
          throw std::runtime_error(str("\"", key, "\" has range [", b, ", ", e, ")"));
      flat.emplace(key, std::move(info));
    }
    for (const auto& [key, k] : m.at("full").items()) {
      auto dtype = dtype_from_name(field<std::string>(k, "dtype"));
      if (!dtype) throw std::runtime_error("unknown dtype for " + key);
      full[key] = {field<std::vector<int64_t>>(k, "shape"), *dtype};
      if (elements_within(full[key].shape, int64_t{1} << 50) < 0)
        throw std::runtime_error(str("\"", key, "\" has an impossible shape"));
    }
    // The readers multiply shapes and index flat tensors with offsets: each parameter must lie
    // inside its unit's flat tensor, checked without overflow before anything is allocated
    // (Note [Input files] in core/input_file.h).
    for (const auto& [unit, layout] : data.layouts) {
      const auto it = flat.find("param/" + unit);
      const int64_t numel = it == flat.end() ? int64_t{1} << 40 : it->second.numel;
      for (const auto& e : layout) {
        const int64_t n = elements_within(e.shape, numel);
        if (n < 0)
          throw std::runtime_error(str("parameter \"", e.name, "\" of unit \"", unit,
                                       "\" has a shape beyond the unit's ", numel, " elements"));
        if (e.offset < 0 || e.offset > numel - n)
          throw std::runtime_error(str("parameter \"", e.name, "\" of unit \"", unit,
                                       "\" has offset ", e.offset, " outside the unit's ", numel,
                                       " elements"));
      }
    }
    for (const auto& [name, f] : m.at("files").items())
      files[name] = {field<int64_t>(f, "bytes"), field<uint32_t>(f, "crc32")};
    for (int r = 0; r < world; ++r)
      if (!files.count(shard_file(r, world)))
        throw std::runtime_error("no entry for " + shard_file(r, world));
    if (!files.count(kFullFile)) throw std::runtime_error("no entry for " + kFullFile);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    DTORCH_FAIL(CheckpointError, path, " is malformed (", json_config::reason(e), "); ", kDamaged);
  }
}

const std::map<std::string, torch::Tensor>& ShardedCheckpointReader::Impl::load(
    const std::string& file) {
  auto it = loaded.find(file);
  if (it != loaded.end()) return it->second;
  const std::string path = path_of(file);
  const auto [bytes, crc] = files.at(file);
  int64_t actual = -1;
  std::string problem = whole.count(file) ? "" : file_problem(path, bytes, crc, &actual);
  const MappedFile mapped = problem.empty() ? map_file(path) : MappedFile();
  if (problem.empty() && static_cast<int64_t>(mapped.size) != bytes)
    problem = str("changed since it was checked: ", mapped.size, " bytes now");
  DTORCH_CHECK_T(CheckpointError, problem.empty(), "checkpoint file ", path, " is unusable (",
                 problem, "); ", kDamaged);
  // Mapped, not read: the tensors are the file's records in place, read where they are used
  // (a resumed shard of gigabytes costs memory only as it is copied into the model).
  std::map<std::string, torch::Tensor> tensors;
  for (auto& [key, t] : unpickle_state_dict(mapped, path))
    tensors.emplace(key, t);
  return loaded.emplace(file, std::move(tensors)).first->second;
}

ShardedCheckpointReader::ShardedCheckpointReader(const std::string& path)
    : impl_(std::make_unique<Impl>()) {
  const std::string name = paths::file_name(path);
  if (!paths::exists(paths::join(path, kMetadata)) && step_of(name) < 0 &&
      name.find(kPartial) == std::string::npos) {
    DTORCH_CHECK_T(CheckpointError, paths::is_directory(path), "checkpoint directory ", path,
                   " does not exist or is not a directory");
    std::optional<ShardedCheckpointReader> latest = open_latest_complete(path);
    if (!latest) {
      bool unfinished = false;
      std::error_code ec;
      for (const std::string& e : paths::list_directory(path, ec))
        unfinished |= e.rfind(kStepPrefix, 0) == 0;
      DTORCH_FAIL(CheckpointError, path,
                  unfinished ? " holds only unfinished saves (step folders without metadata.json)"
                             : " is not a sharded checkpoint: it has neither metadata.json nor "
                               "step-NNNNNN folders",
                  "; pass a run's checkpoint directory or one of its step-NNNNNN folders");
    }
    impl_ = std::move(latest->impl_);  // its files found whole already
    return;
  }
  impl_->dir = path;
  impl_->parse_metadata();
}

ShardedCheckpointReader::~ShardedCheckpointReader() = default;
ShardedCheckpointReader::ShardedCheckpointReader(ShardedCheckpointReader&&) noexcept = default;
ShardedCheckpointReader& ShardedCheckpointReader::operator=(ShardedCheckpointReader&&) noexcept =
    default;

const std::string& ShardedCheckpointReader::dir() const {
  return impl_->dir;
}
int ShardedCheckpointReader::version() const {
  return impl_->version;
}
int ShardedCheckpointReader::world_size() const {
  return impl_->world;
}
const ShardedCheckpointData& ShardedCheckpointReader::data() const {
  return impl_->data;
}
const std::map<std::string, FlatTensorInfo>& ShardedCheckpointReader::flat_tensors() const {
  return impl_->flat;
}
const std::map<std::string, FullTensorInfo>& ShardedCheckpointReader::full_tensors() const {
  return impl_->full;
}
bool ShardedCheckpointReader::has_flat(const std::string& key) const {
  return impl_->flat.count(key) > 0;
}
bool ShardedCheckpointReader::has_full(const std::string& key) const {
  return impl_->full.count(key) > 0;
}

torch::Tensor ShardedCheckpointReader::read_range(const std::string& key, int64_t begin,
                                                  int64_t end) {
  auto it = impl_->flat.find(key);
  DTORCH_CHECK_T(CheckpointError, it != impl_->flat.end(), "checkpoint ", impl_->dir,
                 " holds no flat tensor \"", key, "\" (run `dtorch checkpoint inspect ", impl_->dir,
                 "` to see what it holds)");
  const FlatTensorInfo& info = it->second;
  DTORCH_CHECK_T(CheckpointError, 0 <= begin && begin <= end && end <= info.numel, "range [", begin,
                 ", ", end, ") of \"", key, "\" is outside its ", info.numel,
                 " elements (checkpoint ", impl_->dir, ")");
  torch::Tensor out = torch::empty({end - begin}, info.dtype);
  for (int r = 0; r < impl_->world; ++r) {
    const auto [rb, re] = info.ranges[r];
    const int64_t lo = std::max(begin, rb), hi = std::min(end, re);
    if (lo >= hi) continue;
    const std::string file = shard_file(r, impl_->world);
    const auto& tensors = impl_->load(file);
    auto t = tensors.find(key);
    DTORCH_CHECK_T(CheckpointError,
                   t != tensors.end() && t->second.dim() == 1 && t->second.numel() == re - rb &&
                       t->second.scalar_type() == info.dtype,
                   "checkpoint file ", impl_->path_of(file), " lacks \"", key, "\" as ", re - rb,
                   " ", dtype_name(info.dtype), " elements, as metadata.json records; ", kDamaged);
    out.narrow(0, lo - begin, hi - lo).copy_(t->second.narrow(0, lo - rb, hi - lo));
  }
  return out;
}

torch::Tensor ShardedCheckpointReader::read_flat(const std::string& key) {
  auto it = impl_->flat.find(key);
  return read_range(key, 0, it == impl_->flat.end() ? 0 : it->second.numel);
}

torch::Tensor ShardedCheckpointReader::read_full(const std::string& key) {
  auto it = impl_->full.find(key);
  DTORCH_CHECK_T(CheckpointError, it != impl_->full.end(), "checkpoint ", impl_->dir,
                 " holds no full tensor \"", key, "\" (run `dtorch checkpoint inspect ", impl_->dir,
                 "` to see what it holds)");
  const auto& tensors = impl_->load(kFullFile);
  auto t = tensors.find(key);
  DTORCH_CHECK_T(CheckpointError,
                 t != tensors.end() && t->second.sizes().vec() == it->second.shape &&
                     t->second.scalar_type() == it->second.dtype,
                 "checkpoint file ", impl_->path_of(kFullFile), " lacks \"", key,
                 "\" as metadata.json records it; ", kDamaged);
  return t->second;
}

std::vector<ShardFileStatus> ShardedCheckpointReader::check_files() const {
  std::vector<ShardFileStatus> out;
  for (const auto& [name, expect] : impl_->files) {
    ShardFileStatus s;
    s.path = impl_->path_of(name);
    s.expected_bytes = expect.first;
    s.problem = file_problem(s.path, expect.first, expect.second, &s.actual_bytes);
    s.ok = s.problem.empty();
    if (s.ok) impl_->whole.insert(name);
    out.push_back(std::move(s));
  }
  return out;
}

void ShardedCheckpointReader::verify() const {
  std::string bad;
  for (const auto& s : check_files())
    if (!s.ok) bad += str("\n  ", s.path, ": ", s.problem);
  DTORCH_CHECK_T(CheckpointError, bad.empty(), "checkpoint ", impl_->dir, " is damaged:", bad,
                 "\nThe save did not complete or the files were damaged since; ", kDamaged);
}

StateDict cut_by_layout(const torch::Tensor& flat, const std::vector<FlatLayoutEntry>& layout) {
  StateDict out;
  for (const auto& e : layout) {
    int64_t n = 1;
    for (int64_t d : e.shape)
      n *= d;
    DTORCH_CHECK_T(CheckpointError, e.offset >= 0 && n >= 0 && e.offset + n <= flat.numel(),
                   "parameter \"", e.name, "\" at offset ", e.offset, " with ", n,
                   " elements runs past its unit's ", flat.numel(), " elements");
    out.emplace_back(e.name, flat.narrow(0, e.offset, n).reshape(e.shape).clone());
  }
  return out;
}

StateDict consolidate_model(ShardedCheckpointReader& reader) {
  StateDict out;
  for (const auto& [unit, layout] : reader.data().layouts)
    for (auto& named : cut_by_layout(reader.read_flat("param/" + unit), layout))
      out.push_back(std::move(named));
  const std::string prefix = "buffer/";
  for (const auto& [key, info] : reader.full_tensors())
    if (key.rfind(prefix, 0) == 0)
      out.emplace_back(key.substr(prefix.size()), reader.read_full(key));
  return out;
}

}  // namespace dtorch::checkpoint
