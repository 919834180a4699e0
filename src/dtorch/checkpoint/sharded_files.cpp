// A sharded checkpoint's step folders and names: where a step is saved, which folders of a
// checkpoint directory hold finished saves, the newest intact one, and the file and dtype names
// (sharded_files.h) of Note [Sharded checkpoint format].
#include "dtorch/checkpoint/sharded_files.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "dtorch/checkpoint/sharded_checkpoint.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"

namespace dtorch::checkpoint {
namespace {

const std::vector<std::pair<torch::Dtype, std::string>>& python_dtype_names() {
  static const std::vector<std::pair<torch::Dtype, std::string>> names = {
      {torch::kFloat, "float32"},     {torch::kDouble, "float64"}, {torch::kHalf, "float16"},
      {torch::kBFloat16, "bfloat16"}, {torch::kLong, "int64"},     {torch::kInt, "int32"},
      {torch::kShort, "int16"},       {torch::kChar, "int8"},      {torch::kByte, "uint8"},
      {torch::kBool, "bool"}};
  return names;
}

}  // namespace

std::string shard_file(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "shard-%05d-of-%05d.pt", rank, world);
  return name;
}

int64_t step_of(const std::string& name) {
  if (name.size() <= kStepPrefix.size() || name.compare(0, kStepPrefix.size(), kStepPrefix) != 0)
    return -1;
  std::string digits = name.substr(kStepPrefix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    return -1;
  return std::stoll(digits);
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

std::string sharded_step_dir(const std::string& dir, int64_t global_step) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%06lld", kStepPrefix.c_str(),
                static_cast<long long>(global_step));
  return paths::join(dir, name);
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
  std::optional<ShardedCheckpointReader> reader = open_latest_complete(dir);
  if (!reader) return std::nullopt;
  return reader->dir();
}

std::optional<ShardedCheckpointReader> open_latest_complete(const std::string& dir) {
  std::vector<std::string> dirs = list_sharded_checkpoints(dir);
  if (dirs.empty()) return std::nullopt;
  std::string failures;
  for (size_t i = 0; i < dirs.size(); ++i) {
    try {
      ShardedCheckpointReader reader(dirs[i]);
      reader.verify();
      return reader;
    } catch (const CheckpointError& e) {
      log::warn("checkpoint ", dirs[i], " is unusable (", e.what(), ")",
                i + 1 < dirs.size() ? "; falling back to the previous one" : "");
      failures += str("\n  ", dirs[i], ": ", e.what());
    }
  }
  DTORCH_FAIL(CheckpointError, "no sharded checkpoint in ", dir, " is intact:", failures,
              "\nDelete them (or pass another checkpoint directory) to start from scratch.");
}

}  // namespace dtorch::checkpoint
