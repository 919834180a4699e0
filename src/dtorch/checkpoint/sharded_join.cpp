// Note [Resharding by name]: parameters found by name across checkpoints, read by range.
#include "dtorch/checkpoint/sharded_join.h"

#include <algorithm>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"

namespace dtorch::checkpoint {

std::optional<ShardedJoin> ShardedJoin::open(const std::vector<std::string>& folders) {
  std::vector<std::optional<ShardedCheckpointReader>> newest;
  std::string with, without;
  for (const auto& f : folders) {
    newest.push_back(open_latest_complete(f));
    (newest.back() ? with : without) = f;
  }
  if (with.empty()) return std::nullopt;
  DTORCH_CHECK_T(CheckpointError, without.empty(), without, " holds no sharded checkpoint but ",
                 with, " does: the run that wrote them stopped before its first save finished, ",
                 "or they are another run's; start a new --out");
  int64_t step = -1;
  for (const auto& n : newest) {
    const int64_t s = n->data().global_step;
    step = step < 0 ? s : std::min(step, s);
  }
  // The newest readers found their files whole: kept, so that they are not read again.
  std::vector<ShardedCheckpointReader> readers;
  for (size_t i = 0; i < folders.size(); ++i) {
    const std::string dir = sharded_step_dir(folders[i], step);
    if (dir != newest[i]->dir()) {
      DTORCH_CHECK_T(CheckpointError, paths::exists(dir), newest[i]->dir(), " is newer than ",
                     sharded_step_dir(folders[0], step), " and ", folders[i], " has no step ", step,
                     ": the checkpoints are not from one save; ",
                     "delete the newer ones to resume from the older step");
      newest[i] = ShardedCheckpointReader(dir);
      newest[i]->verify();
    }
    readers.push_back(std::move(*newest[i]));
  }
  return ShardedJoin(std::move(readers));
}

ShardedJoin::ShardedJoin(std::vector<ShardedCheckpointReader> readers) {
  for (auto& reader : readers) {
    readers_.push_back(std::make_shared<ShardedCheckpointReader>(std::move(reader)));
    for (const auto& [unit, entries] : readers_.back()->data().layouts) {
      for (const auto& e : entries)
        sources_.emplace(e.name, Source{unit, e.offset, e.shape, readers_.size() - 1});
    }
  }
}

const ShardedCheckpointData& ShardedJoin::data() const {
  return readers_.front()->data();
}

const std::string& ShardedJoin::dir() const {
  return readers_.front()->dir();
}

std::optional<std::vector<int64_t>> ShardedJoin::shape(const std::string& name) const {
  auto it = sources_.find(name);
  if (it == sources_.end()) return std::nullopt;
  return it->second.shape;
}

bool ShardedJoin::has_state(const std::string& name, const std::string& state) const {
  auto it = sources_.find(name);
  return it != sources_.end() &&
         readers_[it->second.reader]->has_flat("optim/" + it->second.unit + "/" + state);
}

const ShardedJoin::Source& ShardedJoin::source(const std::string& name) const {
  auto it = sources_.find(name);
  DTORCH_CHECK_T(CheckpointError, it != sources_.end(), dir(), " and the checkpoints beside it ",
                 "hold no parameter ", name, ": they were written for another model; use a new ",
                 "--out directory");
  return it->second;
}

torch::Tensor ShardedJoin::read_range(const std::vector<FlatLayoutEntry>& layout,
                                      const std::string& kind, int64_t begin, int64_t end,
                                      torch::Dtype dtype) {
  torch::Tensor out = torch::zeros({end - begin}, dtype);
  for (const auto& e : layout) {
    int64_t numel = 1;
    for (int64_t d : e.shape)
      numel *= d;
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + numel);
    if (lo >= hi) continue;
    const Source& src = source(e.name);
    ShardedCheckpointReader& reader = *readers_[src.reader];
    const std::string key =
        kind == "param" ? "param/" + src.unit : "optim/" + src.unit + kind.substr(kind.find('/'));
    DTORCH_CHECK_T(CheckpointError, reader.has_flat(key), reader.dir(), " has no ", key,
                   " (saved with another optimizer?); start a new --out directory");
    const int64_t from = src.offset + (lo - e.offset);
    out.narrow(0, lo - begin, hi - lo).copy_(reader.read_range(key, from, from + (hi - lo)));
  }
  return out;
}

bool ShardedJoin::has_full(const std::string& key) const {
  return std::any_of(readers_.begin(), readers_.end(),
                     [&](const auto& r) { return r->has_full(key); });
}

torch::Tensor ShardedJoin::read_full(const std::string& key, const std::string& prefer) {
  auto it = sources_.find(prefer);
  if (it != sources_.end() && readers_[it->second.reader]->has_full(key))
    return readers_[it->second.reader]->read_full(key);
  auto r = std::find_if(readers_.begin(), readers_.end(),
                        [&](const auto& r) { return r->has_full(key); });
  DTORCH_CHECK_T(CheckpointError, r != readers_.end(), dir(), " and the checkpoints beside it ",
                 "hold no ", key, ": they were written for another model; use a new --out ",
                 "directory");
  return (*r)->read_full(key);
}

}  // namespace dtorch::checkpoint
