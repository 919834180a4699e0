// The sharded checkpoint save (see Note [Sharded checkpoint format]): the ranks agree on what is
// saved, each writes its file, and rank 0 publishes the step all or nothing. The reader is in
// sharded_checkpoint_reader.cpp, the step folders in sharded_files.cpp.
#include "dtorch/checkpoint/sharded_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "dtorch/checkpoint/crc32.h"
#include "dtorch/checkpoint/sharded_files.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"

namespace dtorch::checkpoint {
namespace {

using json = nlohmann::json;

const std::string kReplaced = ".replaced";

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

}  // namespace

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

}  // namespace dtorch::checkpoint
