// Sharded checkpoints (see Note [Sharded checkpoint format]): the collective save with its
// all-or-nothing publication, and the reader that reassembles any range at any world size.
#include "dtorch/checkpoint/sharded_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "dtorch/checkpoint/crc32.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "dtorch/core/json_config.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"

namespace dtorch::checkpoint {
namespace {

using json = nlohmann::json;

const std::string kFormat = "dtorch-sharded-checkpoint";
const std::string kStepPrefix = "step-";
const std::string kPartial = ".partial";
const std::string kReplaced = ".replaced";
const std::string kMetadata = "metadata.json";
const std::string kFullFile = "full.pt";
const std::string kDamaged =
    "fall back to an older step directory (delete this one, or pass an older one) or re-run "
    "the save";

std::string shard_file(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "shard-%05d-of-%05d.pt", rank, world);
  return name;
}

// The step of a step directory name, or -1 for any other name (staging folders included).
int64_t step_of(const std::string& name) {
  if (name.size() <= kStepPrefix.size() || name.compare(0, kStepPrefix.size(), kStepPrefix) != 0)
    return -1;
  std::string digits = name.substr(kStepPrefix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    return -1;
  return std::stoll(digits);
}

// Python's names, so metadata.json reads the same as torch's dtype attributes.
const std::vector<std::pair<torch::Dtype, std::string>>& python_dtype_names() {
  static const std::vector<std::pair<torch::Dtype, std::string>> names = {
      {torch::kFloat, "float32"},     {torch::kDouble, "float64"}, {torch::kHalf, "float16"},
      {torch::kBFloat16, "bfloat16"}, {torch::kLong, "int64"},     {torch::kInt, "int32"},
      {torch::kShort, "int16"},       {torch::kChar, "int8"},      {torch::kByte, "uint8"},
      {torch::kBool, "bool"}};
  return names;
}

std::string dtype_name(torch::Dtype d) {
  for (const auto& [dtype, name] : python_dtype_names())
    if (dtype == d) return name;
  return str(d);
}

std::optional<torch::Dtype> dtype_from_name(const std::string& s) {
  for (const auto& [dtype, name] : python_dtype_names())
    if (name == s) return dtype;
  return std::nullopt;
}

// A CPU tensor whose storage is exactly its elements: pickling a view would save the whole
// storage behind it (a ZeRO engine's pieces are views into one padded flat buffer). A
// contiguous view becomes an alias over its own elements that keeps the buffer alive, not a
// copy: a rank's shards are gigabytes.
torch::Tensor compact(const torch::Tensor& t) {
  torch::Tensor c = t.detach();
  if (!c.device().is_cpu()) c = c.cpu();
  if (!c.is_contiguous()) c = c.contiguous();
  const size_t need = static_cast<size_t>(c.numel()) * c.element_size();
  if (c.storage_offset() == 0 && c.storage().nbytes() == need) return c;
  return torch::from_blob(
      c.data_ptr(), c.sizes(), [keep = c](void*) {}, c.options());
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// ---- saving ----------------------------------------------------------------------------------

// What this rank will save, as JSON for the other ranks, or {"error": why} when its own
// arguments are wrong; every rank then judges the whole save the same way.
json describe_local(const ShardedCheckpointData& data, const std::vector<ShardPiece>& mine,
                    const std::vector<std::pair<std::string, torch::Tensor>>& full, int rank) {
  json meta = json::parse(data.metadata_json, nullptr, false);
  if (meta.is_discarded() || !meta.is_object())
    return {{"error", "metadata must be a JSON object, got: " + data.metadata_json}};
  json pieces = json::array();
  std::set<std::string> seen;
  for (const auto& p : mine) {
    const std::string where = "piece \"" + p.key + "\"";
    if (p.key.empty()) return {{"error", "a piece has an empty key"}};
    if (!seen.insert(p.key).second) return {{"error", where + " is given twice"}};
    if (!p.data.defined() || p.data.dim() != 1) return {{"error", where + " is not a 1-D tensor"}};
    const int64_t end = p.begin + p.data.numel();
    if (p.numel < 0 || p.begin < 0 || end > p.numel)
      return {{"error", str(where, " covers [", p.begin, ", ", end, ") of a tensor of ", p.numel,
                            " elements")}};
    if (!dtype_from_name(dtype_name(p.data.scalar_type())))
      return {{"error", str(where, " has unsupported dtype ", p.data.scalar_type())}};
    pieces.push_back({{"key", p.key},
                      {"numel", p.numel},
                      {"begin", p.begin},
                      {"end", end},
                      {"dtype", dtype_name(p.data.scalar_type())}});
  }
  json out = {{"pieces", pieces}};
  if (rank == 0) {
    json f = json::object();
    for (const auto& [key, t] : full) {
      if (key.empty() || f.contains(key) || !t.defined())
        return {{"error", "full tensor \"" + key + "\" is empty-named, repeated or undefined"}};
      if (!dtype_from_name(dtype_name(t.scalar_type())))
        return {
            {"error", str("full tensor \"", key, "\" has unsupported dtype ", t.scalar_type())}};
      f[key] = {{"shape", t.sizes().vec()}, {"dtype", dtype_name(t.scalar_type())}};
    }
    out["full"] = f;
  }
  return out;
}

// Every rank's description (a gather of strings built from two allgathers).
std::vector<json> gather_descriptions(comm::Communicator& comm, const json& mine) {
  const std::string text = mine.dump();
  const int n = comm.size();
  std::vector<torch::Tensor> lengths(n);
  for (auto& t : lengths)
    t = torch::empty({1}, torch::kLong);
  comm.allgather(lengths, torch::full({1}, static_cast<int64_t>(text.size()), torch::kLong),
                 "sharded checkpoint: description lengths");
  int64_t longest = 0;
  for (const auto& t : lengths)
    longest = std::max(longest, t.item<int64_t>());
  torch::Tensor buf = torch::zeros({longest}, torch::kByte);
  if (!text.empty()) std::memcpy(buf.data_ptr(), text.data(), text.size());
  std::vector<torch::Tensor> all(n);
  for (auto& t : all)
    t = torch::empty({longest}, torch::kByte);
  comm.allgather(all, buf, "sharded checkpoint: descriptions");
  std::vector<json> out;
  for (int r = 0; r < n; ++r) {
    const char* p = static_cast<const char*>(all[r].data_ptr());
    out.push_back(json::parse(std::string(p, lengths[r].item<int64_t>())));
  }
  return out;
}

// Merges the ranks' pieces into per-key descriptions and checks that they tile every key and
// that the layouts fit; returns what is wrong ("" when nothing). Deterministic, so every rank
// reaches the same verdict without another collective.
std::string plan(const std::vector<json>& ranks, const ShardedCheckpointData& data,
                 std::map<std::string, FlatTensorInfo>* flat) {
  const int world = static_cast<int>(ranks.size());
  std::string errors;
  for (int r = 0; r < world; ++r)
    if (ranks[r].contains("error"))
      errors += str("\n  rank ", r, ": ", ranks[r]["error"].get<std::string>());
  if (!errors.empty()) return errors;
  for (int r = 0; r < world; ++r) {
    for (const auto& p : ranks[r]["pieces"]) {
      const std::string key = p["key"];
      const auto dtype = *dtype_from_name(p["dtype"].get<std::string>());
      auto [it, fresh] = flat->try_emplace(key);
      FlatTensorInfo& info = it->second;
      if (fresh) {
        info.numel = p["numel"];
        info.dtype = dtype;
        info.ranges.assign(world, {0, 0});
      } else if (info.numel != p["numel"].get<int64_t>() || info.dtype != dtype) {
        errors += str("\n  \"", key, "\": rank ", r, " gives ", p["numel"].get<int64_t>(), " ",
                      p["dtype"].get<std::string>(), " elements, another rank ", info.numel, " ",
                      dtype_name(info.dtype));
      }
      info.ranges[r] = {p["begin"].get<int64_t>(), p["end"].get<int64_t>()};
    }
  }
  for (const auto& [key, info] : *flat) {
    std::vector<std::pair<std::pair<int64_t, int64_t>, int>> owned;
    for (int r = 0; r < world; ++r)
      if (info.ranges[r].second > info.ranges[r].first) owned.push_back({info.ranges[r], r});
    std::sort(owned.begin(), owned.end());
    int64_t pos = 0;
    for (const auto& [range, r] : owned) {
      if (range.first > pos)
        errors +=
            str("\n  \"", key, "\": elements [", pos, ", ", range.first, ") are saved by no rank");
      if (range.first < pos)
        errors += str("\n  \"", key, "\": rank ", r, "'s [", range.first, ", ", range.second,
                      ") overlaps another rank's piece");
      pos = std::max(pos, range.second);
    }
    if (pos < info.numel)
      errors +=
          str("\n  \"", key, "\": elements [", pos, ", ", info.numel, ") are saved by no rank");
  }
  if (ranks[0].contains("full"))
    for (const auto& [key, _] : ranks[0]["full"].items())
      if (flat->count(key)) errors += str("\n  \"", key, "\" is both a flat and a full tensor");
  std::set<std::string> names;
  for (const auto& [unit, layout] : data.layouts) {
    auto it = flat->find("param/" + unit);
    if (it == flat->end()) {
      errors += str("\n  unit \"", unit, "\" has a layout but no piece of \"param/", unit, "\"");
      continue;
    }
    for (const auto& e : layout) {
      int64_t n = 1;
      for (int64_t d : e.shape)
        n *= d;
      if (e.offset < 0 || n < 0 || e.offset + n > it->second.numel)
        errors += str("\n  unit \"", unit, "\": \"", e.name, "\" at offset ", e.offset, " with ", n,
                      " elements runs past the unit's ", it->second.numel, " elements");
      if (!names.insert(e.name).second)
        errors += str("\n  parameter \"", e.name, "\" appears in two layouts");
    }
  }
  return errors;
}

json metadata_of(const ShardedCheckpointData& data, int world,
                 const std::map<std::string, FlatTensorInfo>& flat, const json& full,
                 const torch::Tensor& files) {
  json layouts = json::object();
  for (const auto& [unit, layout] : data.layouts) {
    json entries = json::array();
    for (const auto& e : layout)
      entries.push_back({{"name", e.name}, {"shape", e.shape}, {"offset", e.offset}});
    layouts[unit] = entries;
  }
  json keys = json::object();
  for (const auto& [key, info] : flat) {
    json ranges = json::array();
    for (const auto& [b, e] : info.ranges)
      ranges.push_back({b, e});
    keys[key] = {{"numel", info.numel}, {"dtype", dtype_name(info.dtype)}, {"ranges", ranges}};
  }
  json file_list = json::object();
  auto f = files.accessor<int64_t, 2>();
  for (int r = 0; r < world; ++r)
    file_list[shard_file(r, world)] = {{"bytes", f[r][1]}, {"crc32", f[r][2]}};
  file_list[kFullFile] = {{"bytes", f[0][3]}, {"crc32", f[0][4]}};
  return {{"format", kFormat},
          {"version", kShardedCheckpointVersion},
          {"world_size", world},
          {"epoch", data.epoch},
          {"global_step", data.global_step},
          {"metadata", json::parse(data.metadata_json)},
          {"layouts", layouts},
          {"flat", keys},
          {"full", full},
          {"files", file_list}};
}

// Writes `state` to `path` as it is serialized; returns {bytes, crc32}. The file's CRC-32 is
// its only one (Note [One checksum per file] in torch_save.cpp).
std::pair<int64_t, int64_t> write_tensors(const std::string& path, const StateDict& state) {
  int64_t bytes = 0;
  uint32_t crc = crc32_of(nullptr, 0);
  auto why = dtorch::write_file_atomically(path, [&](const ByteSink& sink) {
    stream_state_dict(
        state,
        [&](const char* data, size_t n) {
          bytes += static_cast<int64_t>(n);
          crc = crc32_update(crc, data, n);
          return sink(data, n);
        },
        RecordCrcs::LeftOut);
  });
  DTORCH_CHECK_T(CheckpointError, !why, *why);
  return {bytes, crc};
}

// Rank 0's last act: metadata.json into the staging folder, the folder renamed into place,
// old checkpoints pruned. Returns what went wrong, "" on success.
std::string publish(const std::string& dir, const std::string& staging, const json& meta,
                    int64_t step, int keep) {
  const std::string final_dir = sharded_step_dir(dir, step);
  try {
    const std::string text = meta.dump(1);
    write_file_atomically(paths::join(staging, kMetadata),
                          std::vector<char>(text.begin(), text.end()));
    std::error_code ec;
    if (paths::exists(final_dir)) {
      // Re-saving a step: the old copy moves aside first, as rename cannot replace a folder.
      const std::string old = final_dir + kReplaced;
      paths::remove_all(old, ec);
      paths::rename(final_dir, old);
      paths::rename(staging, final_dir);
      paths::remove_all(old, ec);
    } else {
      paths::rename(staging, final_dir);
    }
    fsync_dir(dir);
  } catch (const std::exception& e) {
    return str("cannot publish ", final_dir, ": ", e.what());
  }
  // Prune only once the new checkpoint is in place; never the one just written.
  std::vector<std::string> all = list_sharded_checkpoints(dir);
  if (!all.empty() && all.front() != final_dir)
    log::warn("checkpoint directory ", dir, " holds ", all.front(), ", newer than ", final_dir,
              " just written; resuming will pick the newer one (use a fresh "
              "checkpoint directory per run)");
  int others_kept = 0;
  for (const auto& d : all) {
    if (d == final_dir) continue;
    if (others_kept++ < keep - 1) continue;
    std::error_code ec;
    paths::remove_all(d, ec);
    if (ec) log::warn("could not delete old checkpoint ", d, ": ", ec.message());
  }
  return "";
}

// ---- reading ---------------------------------------------------------------------------------

// What is wrong with `path` against its recorded size and CRC ("" when nothing); the bytes go
// to *bytes when asked for.
std::string file_problem(const std::string& path, int64_t expect_bytes, uint32_t expect_crc,
                         int64_t* actual, std::vector<char>* bytes) {
  *actual = -1;
  if (!paths::is_regular_file(path)) return "missing";
  std::vector<char> b;
  try {
    b = read_file(path);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  *actual = static_cast<int64_t>(b.size());
  if (*actual != expect_bytes)
    return str(*actual < expect_bytes ? "truncated" : "too long", ": ", *actual,
               " bytes, metadata.json records ", expect_bytes);
  if (crc32_of(b.data(), b.size()) != expect_crc) return "CRC32 mismatch: the file is corrupt";
  if (bytes) *bytes = std::move(b);
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

std::string sharded_step_dir(const std::string& dir, int64_t global_step) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%06lld", kStepPrefix.c_str(),
                static_cast<long long>(global_step));
  return paths::join(dir, name);
}

void save_sharded_checkpoint(
    const std::string& dir, const ShardedCheckpointData& data, const std::vector<ShardPiece>& mine,
    const std::vector<std::pair<std::string, torch::Tensor>>& full_on_rank0,
    comm::Communicator& comm, int keep) {
  DTORCH_CHECK_T(ConfigError, keep >= 1, "checkpoints to keep is ", keep, ", must be >= 1");
  const int rank = comm.rank(), world = comm.size();
  DTORCH_CHECK_T(CheckpointError, data.global_step >= 0, "checkpoint global step is ",
                 data.global_step);

  // 1. Agree on what is saved before anything is written.
  std::vector<json> ranks =
      gather_descriptions(comm, describe_local(data, mine, full_on_rank0, rank));
  std::map<std::string, FlatTensorInfo> flat;
  std::string wrong = plan(ranks, data, &flat);
  DTORCH_CHECK_T(CheckpointError, wrong.empty(), "sharded checkpoint for step ", data.global_step,
                 " not saved, its pieces do not fit together:", wrong,
                 "\nEvery rank must pass the same layouts and pieces that tile each key exactly.");

  // 2. Rank 0 prepares the staging folder (an earlier, interrupted save may have left one).
  const std::string staging = sharded_step_dir(dir, data.global_step) + kPartial;
  std::string problem;
  if (rank == 0) {
    std::error_code ec;
    paths::create_directories(dir, ec);
    paths::remove_all(staging, ec);
    if (!paths::create_directory(staging, ec) && !paths::is_directory(staging))
      problem = str("cannot create ", staging, ": ", ec.message(),
                    " (pass a writable checkpoint directory)");
  }
  problem = comm.broadcast_string(problem, 0, "sharded checkpoint: staging folder");
  DTORCH_CHECK_T(CheckpointError, problem.empty(), problem);

  // 3. Every rank writes its file; rank 0 also the full tensors. Failures are exchanged, not
  // thrown, so no rank is left waiting in a collective.
  torch::Tensor mine_info = torch::zeros({5}, torch::kLong);
  int64_t* info = mine_info.data_ptr<int64_t>();  // ok, bytes, crc, full.pt bytes, its crc
  try {
    StateDict pieces;
    for (const auto& p : mine)
      pieces.emplace_back(p.key, compact(p.data));
    auto [bytes, crc] = write_tensors(paths::join(staging, shard_file(rank, world)), pieces);
    info[1] = bytes;
    info[2] = crc;
    if (rank == 0) {
      StateDict full;
      for (const auto& [key, t] : full_on_rank0)
        full.emplace_back(key, compact(t));
      auto [fbytes, fcrc] = write_tensors(paths::join(staging, kFullFile), full);
      info[3] = fbytes;
      info[4] = fcrc;
    }
    info[0] = 1;
  } catch (const std::exception& e) {
    log::error("cannot write this rank's part of checkpoint step ", data.global_step, ": ",
               e.what());
  }
  std::vector<torch::Tensor> all(world);
  for (auto& t : all)
    t = torch::empty({5}, torch::kLong);
  comm.allgather(all, mine_info, "sharded checkpoint: file checksums");
  torch::Tensor files = torch::stack(all);
  std::string failed;
  for (int r = 0; r < world; ++r)
    if (files[r][0].item<int64_t>() != 1) failed += str(failed.empty() ? "" : ", ", r);
  if (!failed.empty()) {
    if (rank == 0) {
      std::error_code ec;
      paths::remove_all(staging, ec);
    }
    DTORCH_FAIL(CheckpointError, "sharded checkpoint for step ", data.global_step,
                " not saved: rank(s) ", failed,
                " could not write their files (see their log; "
                "every rank must reach the checkpoint directory ",
                dir, ", on a file system all nodes share); earlier checkpoints are untouched");
  }

  // 4. Rank 0 writes metadata.json last and publishes; everyone learns the outcome.
  if (rank == 0) {
    problem = publish(dir, staging, metadata_of(data, world, flat, ranks[0]["full"], files),
                      data.global_step, keep);
    if (!problem.empty()) {
      std::error_code ec;
      paths::remove_all(staging, ec);
    }
  }
  problem = comm.broadcast_string(problem, 0, "sharded checkpoint: publish");
  DTORCH_CHECK_T(CheckpointError, problem.empty(), "sharded checkpoint for step ", data.global_step,
                 " not saved: ", problem, "; earlier checkpoints are untouched");
}

CheckpointData checkpoint_data(const ShardedCheckpointData& data) {
  return {data.epoch, data.global_step, data.metadata_json};
}

std::vector<int> writers_by_bytes(const std::vector<int64_t>& bytes, int world) {
  DTORCH_CHECK_T(ConfigError, world >= 1, "a save needs at least one rank, got ", world);
  std::vector<size_t> order(bytes.size());
  for (size_t i = 0; i < order.size(); ++i) {
    DTORCH_CHECK_T(ConfigError, bytes[i] >= 0, "tensor ", i, " has ", bytes[i], " bytes");
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  std::vector<int64_t> load(world, 0);
  std::vector<int> writer(bytes.size(), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    writer[i] = r;
    load[r] += bytes[i];
  }
  return writer;
}

std::vector<std::string> list_sharded_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;  // no folder, or an unreadable one: no checkpoints
  for (const std::string& name : paths::list_directory(dir, ec)) {
    const std::string path = paths::join(dir, name);
    int64_t step = step_of(name);
    if (step >= 0 && paths::is_directory(path) && paths::exists(paths::join(path, kMetadata)))
      found.emplace_back(step, path);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<std::string> out;
  for (auto& f : found)
    out.push_back(std::move(f.second));
  return out;
}

std::optional<std::string> latest_complete(const std::string& dir) {
  std::vector<std::string> dirs = list_sharded_checkpoints(dir);
  if (dirs.empty()) return std::nullopt;
  std::string failures;
  for (size_t i = 0; i < dirs.size(); ++i) {
    try {
      ShardedCheckpointReader reader(dirs[i]);
      reader.verify();
      return dirs[i];
    } catch (const CheckpointError& e) {
      log::warn("checkpoint ", dirs[i], " is unusable (", e.what(), ")",
                i + 1 < dirs.size() ? "; falling back to the previous one" : "");
      failures += str("\n  ", dirs[i], ": ", e.what());
    }
  }
  DTORCH_FAIL(CheckpointError, "no sharded checkpoint in ", dir, " is intact:", failures,
              "\nDelete them (or pass another checkpoint directory) to start from scratch.");
}

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
  std::vector<char> content;
  int64_t actual = -1;
  std::string problem = file_problem(path, bytes, crc, &actual, &content);
  DTORCH_CHECK_T(CheckpointError, problem.empty(), "checkpoint file ", path, " is unusable (",
                 problem, "); ", kDamaged);
  std::map<std::string, torch::Tensor> tensors;
  for (auto& [key, t] : unpickle_state_dict(content, path))
    tensors.emplace(key, t);
  return loaded.emplace(file, std::move(tensors)).first->second;
}

ShardedCheckpointReader::ShardedCheckpointReader(const std::string& path)
    : impl_(std::make_unique<Impl>()) {
  const std::string name = paths::file_name(path);
  std::string step_dir = path;
  if (!paths::exists(paths::join(path, kMetadata)) && step_of(name) < 0 &&
      name.find(kPartial) == std::string::npos) {
    DTORCH_CHECK_T(CheckpointError, paths::is_directory(path), "checkpoint directory ", path,
                   " does not exist or is not a directory");
    std::optional<std::string> latest = latest_complete(path);
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
    step_dir = *latest;
  }
  impl_->dir = step_dir;
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
    s.problem = file_problem(s.path, expect.first, expect.second, &s.actual_bytes, nullptr);
    s.ok = s.problem.empty();
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
