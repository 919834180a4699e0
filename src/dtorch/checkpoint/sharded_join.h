// Several sharded checkpoints read as one, by parameter name: a run reads the shards of a run
// whose units were cut elsewhere (other pipeline stages, other ZeRO units) (Note [Resharding
// by name]).
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtorch/checkpoint/sharded_checkpoint.h"

namespace dtorch::checkpoint {

/// Note [Resharding by name]
/// A sharded checkpoint stores each unit's parameters as one flat tensor ("param/<unit>") and
/// its layout (Note [Sharded checkpoint format]). Reading by unit needs the saving run's
/// units; a run whose units differ (another --pp or --pp-split or schedule, pipeline or not,
/// another --strategy or wrap policy) reads by name instead. For each entry of its own unit's
/// layout that overlaps the range it wants, the parameter of that name is found in one of the
/// checkpoints (the first that holds it: a GPT's tied embedding is in its first and its last
/// stage, equal in both) and the matching elements are read from that checkpoint's unit at
/// that parameter's offset. The optimizer's per-element state ("optim/<unit>/<state>") is cut
/// the same way, so resharding keeps Adam's moments. A rank reads only the files its range
/// overlaps.
class ShardedJoin {
 public:
  /// The newest step that every folder in `folders` (run folders of sharded checkpoints)
  /// holds; nullopt when none holds any. A save stopped after some folders were written leaves
  /// those a step ahead: the step they all hold is taken. CheckpointError when a folder holds
  /// none while another does, or when they share no step.
  static std::optional<ShardedJoin> open(const std::vector<std::string>& folders);

  /// Epoch, global step and metadata of the checkpoint (the first folder's).
  const ShardedCheckpointData& data() const;
  /// The first folder's step directory, for messages.
  const std::string& dir() const;
  /// The shape saved for parameter `name`; nullopt when no checkpoint holds it.
  std::optional<std::vector<int64_t>> shape(const std::string& name) const;
  /// Whether the checkpoint holding parameter `name` holds its optimizer state `state` (such as
  /// "exp_avg"); false when none holds the parameter.
  bool has_state(const std::string& name, const std::string& state) const;

  /// Elements [begin, end) of the flat tensor `kind` ("param", or "optim/<state>" such as
  /// "optim/exp_avg") of a unit laid out as `layout`, in `dtype`. CheckpointError names a
  /// parameter no checkpoint holds, or a state its checkpoint lacks.
  torch::Tensor read_range(const std::vector<FlatLayoutEntry>& layout, const std::string& kind,
                           int64_t begin, int64_t end, torch::Dtype dtype);
  /// Full tensor `key` from the first checkpoint that holds it; `prefer`, when it names a
  /// parameter, picks the checkpoint holding that parameter first (rng_state of its stage).
  bool has_full(const std::string& key) const;
  torch::Tensor read_full(const std::string& key, const std::string& prefer = "");

 private:
  struct Source {
    std::string unit;  ///< the saving run's unit holding the parameter
    int64_t offset = 0;
    std::vector<int64_t> shape;
    size_t reader = 0;
  };
  explicit ShardedJoin(std::vector<ShardedCheckpointReader> readers);
  const Source& source(const std::string& name) const;

  std::vector<std::shared_ptr<ShardedCheckpointReader>> readers_;
  std::map<std::string, Source> sources_;
};

}  // namespace dtorch::checkpoint
