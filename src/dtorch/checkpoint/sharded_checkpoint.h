// Sharded checkpoints: every rank writes only the slice of the model and optimizer state it
// owns, and any number of ranks can later read any slice back (resharding), or one process can
// consolidate the whole model into a state dict that Python's torch.load reads.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/checkpoint/state_dict.h"

namespace dtorch::comm {
class Communicator;
}

namespace dtorch::checkpoint {

/// Note [Sharded checkpoint format]
/// What it holds. A sharded checkpoint stores named *flat tensors*: 1-D tensors of `numel`
/// elements (the logical, unpadded length), under keys such as "param/<unit>",
/// "optim/<unit>/exp_avg", "optim/<unit>/exp_avg_sq", "optim/<unit>/momentum_buffer". Each
/// rank saves the piece [begin, end) of each key that it owns; the pieces of all ranks tile
/// [0, numel) exactly (a rank may own an empty piece, or leave the key out). A key has one
/// dtype. A *layout* per unit lists (parameter name, shape, offset) so "param/<unit>" can be
/// cut into named parameters, and "optim/<unit>/X" into per-parameter optimizer state. Rank 0
/// also saves *full tensors* once: buffers as "buffer/<name>" (BatchNorm running stats) and
/// small scalars such as "optim/step". Nothing here knows how the pieces were chosen, so any
/// sharding engine (ZeRO-1/2/3, FSDP-like) can write and read it at any world size.
///
/// On disk. DIR/step-NNNNNN/ (NNNNNN = global step) holds
///   shard-RRRRR-of-WWWWW.pt  rank R's pieces: a torch.save-format pickle of {key: 1-D tensor}
///   full.pt                  rank 0's full tensors, same format
///   metadata.json            written last, see below
/// Python reads every .pt file with torch.load. metadata.json is {"format":
/// "dtorch-sharded-checkpoint", "version", "world_size", "epoch", "global_step", "metadata"
/// (the trainer's JSON object), "layouts" {unit: [{"name", "shape", "offset"}]}, "flat" {key:
/// {"numel", "dtype", "ranges": [[begin, end] per rank]}}, "full" {key: {"shape", "dtype"}},
/// "files" {file name: {"bytes", "crc32"}}}. Every file's size and CRC32 are checked before it
/// is parsed, so truncation and corruption are reported by file name.
///
/// Atomicity. Ranks write into DIR/step-NNNNNN.partial/; once every rank's file is in place,
/// rank 0 writes metadata.json there and renames the folder to step-NNNNNN. A folder without
/// metadata.json (or named *.partial) is an unfinished save and is ignored, so a save that
/// fails or is killed leaves every earlier checkpoint as it was.
inline constexpr int kShardedCheckpointVersion = 1;

/// One parameter inside a unit's flat buffer: elements [offset, offset + numel(shape)).
struct FlatLayoutEntry {
  std::string name;            ///< the parameter's state-dict name, e.g. "conv1.weight"
  std::vector<int64_t> shape;  ///< its shape; [] for a scalar
  int64_t offset = 0;          ///< first element in the unit's flat tensor
};

/// The piece of one flat tensor that this rank owns.
struct ShardPiece {
  std::string key;     ///< e.g. "param/0" or "optim/0/exp_avg"
  int64_t numel = 0;   ///< elements of the whole flat tensor, unpadded
  int64_t begin = 0;   ///< first element owned; the piece ends at begin + data.numel()
  torch::Tensor data;  ///< 1-D CPU tensor of the owned elements (end - begin of them)
};

/// What a sharded checkpoint records besides the tensors.
struct ShardedCheckpointData {
  int64_t epoch = 0;        ///< epochs completed when it was written
  int64_t global_step = 0;  ///< optimizer steps so far; names the step directory
  /// A JSON object as text (model name, strategy, optimizer type, ...). Returned by a reader
  /// as compact JSON with keys sorted (the same object, not necessarily the same text).
  std::string metadata_json = "{}";
  /// unit -> its parameters, to cut "param/<unit>" (and "optim/<unit>/...") into named tensors.
  std::map<std::string, std::vector<FlatLayoutEntry>> layouts;
};

/// Note [Saving replicated state]
/// Under DDP every rank holds every parameter and its optimizer state. One writer would write
/// them all while the others wait (and, in the background, copy them all); instead each tensor
/// is written once, by one of the ranks that hold it, and all ranks write at once into the
/// sharded format, as PyTorch DCP deduplicates replicated tensors. The writers are chosen by
/// writers_by_bytes: largest tensor first, each to the rank with the fewest bytes so far (ties
/// to the lowest rank), so no rank writes more than the average plus one tensor. Every rank
/// computes the same choice from the same sizes, without a collective. A tensor's pieces are
/// not cut across ranks, so a checkpoint names each tensor as one unit of its own and reads
/// back at any world size and under any strategy (Note [Resharding by name]). Under a
/// pipeline each stage's dp ranks share their stage (Note [Pipeline checkpoints]); under
/// tensor parallelism the tp ranks that gather the unsplit model share it (Note
/// [Tensor-parallel checkpoints]).

/// The rank among `world` that writes each tensor of `bytes` (Note [Saving replicated
/// state]). Throws ConfigError when world < 1 or a size is negative.
std::vector<int> writers_by_bytes(const std::vector<int64_t>& bytes, int world);

/// Its epoch, global step and metadata as a one-file checkpoint records them.
CheckpointData checkpoint_data(const ShardedCheckpointData& data);

/// DIR/step-NNNNNN for `global_step`.
std::string sharded_step_dir(const std::string& dir, int64_t global_step);

/// Collective: every rank calls it with its own pieces. Writes the checkpoint for
/// data.global_step into `dir` (Note [Sharded checkpoint format]); `full_on_rank0` is written
/// by rank 0 and ignored on other ranks. Then rank 0 deletes all but the newest `keep`
/// complete checkpoints. Every rank returns once the checkpoint is complete, or every rank
/// throws CheckpointError (pieces that do not tile a key, a metadata text that is not a JSON
/// object, a layout that does not fit its "param/<unit>", a file that could not be written),
/// leaving existing checkpoints untouched. Re-saving an existing step replaces it. Throws
/// ConfigError when keep < 1.
void save_sharded_checkpoint(
    const std::string& dir, const ShardedCheckpointData& data, const std::vector<ShardPiece>& mine,
    const std::vector<std::pair<std::string, torch::Tensor>>& full_on_rank0,
    comm::Communicator& comm, int keep = 2);

/// Step directories in `dir` that hold a metadata.json, newest first (nothing is verified).
/// Empty when `dir` does not exist.
std::vector<std::string> list_sharded_checkpoints(const std::string& dir);

/// The newest step directory in `dir` whose metadata parses and whose every file has the
/// recorded size and CRC32 (this reads every file once). Newer ones that fail are skipped with
/// a warning naming the file and why. Returns nullopt when `dir` holds no complete
/// checkpoint; throws CheckpointError naming each one when none verifies.
std::optional<std::string> latest_complete(const std::string& dir);

class ShardedCheckpointReader;
/// The same checkpoint opened: its reader, whose files latest_complete found whole and which
/// does not read them again before it uses them (a resume's shards are gigabytes).
std::optional<ShardedCheckpointReader> open_latest_complete(const std::string& dir);

/// Description of a flat tensor in a checkpoint.
struct FlatTensorInfo {
  int64_t numel = 0;
  torch::Dtype dtype = torch::kFloat;
  /// [begin, end) saved by each rank of the saving job, indexed by rank.
  std::vector<std::pair<int64_t, int64_t>> ranges;
};

/// Description of a full tensor in a checkpoint.
struct FullTensorInfo {
  std::vector<int64_t> shape;
  torch::Dtype dtype = torch::kFloat;
};

/// One file of a checkpoint as found on disk, against what metadata.json records.
struct ShardFileStatus {
  std::string path;
  int64_t expected_bytes = 0;
  int64_t actual_bytes = -1;  ///< -1 when the file is missing
  bool ok = false;            ///< size and CRC32 both match
  std::string problem;        ///< why not, when !ok
};

/// Reads a sharded checkpoint at any world size. Files are read lazily, only those a request
/// overlaps, each verified (size, CRC32, read in pieces) when first needed unless check_files()
/// found it whole already, and then mapped into memory until the reader is destroyed: a request
/// costs memory for what it returns, not for the files it comes from. Not thread-safe.
class ShardedCheckpointReader {
 public:
  /// `path` is a step directory, or a run's checkpoint directory (then its latest_complete()).
  /// Throws CheckpointError when it is neither, when the checkpoint is incomplete, or when
  /// metadata.json is missing, garbled or of another format version.
  explicit ShardedCheckpointReader(const std::string& path);
  ~ShardedCheckpointReader();
  ShardedCheckpointReader(ShardedCheckpointReader&&) noexcept;
  ShardedCheckpointReader& operator=(ShardedCheckpointReader&&) noexcept;

  /// The step directory being read.
  const std::string& dir() const;
  int version() const;
  /// World size of the job that saved it.
  int world_size() const;
  /// Epoch, global step, the trainer's metadata and the units' layouts.
  const ShardedCheckpointData& data() const;
  const std::map<std::string, FlatTensorInfo>& flat_tensors() const;
  const std::map<std::string, FullTensorInfo>& full_tensors() const;
  bool has_flat(const std::string& key) const;
  bool has_full(const std::string& key) const;

  /// Elements [begin, end) of flat tensor `key` (a new 1-D tensor of its dtype), assembled
  /// from the shard files that overlap the range. Throws CheckpointError for an unknown key,
  /// a range outside [0, numel), or a missing or corrupt file (named).
  torch::Tensor read_range(const std::string& key, int64_t begin, int64_t end);
  /// The whole flat tensor `key`.
  torch::Tensor read_flat(const std::string& key);
  /// Full tensor `key` (e.g. "buffer/bn.running_mean", "optim/step").
  torch::Tensor read_full(const std::string& key);

  /// Size and CRC32 of every file, without parsing any (reads each file once); the files found
  /// whole are not read again to load them.
  std::vector<ShardFileStatus> check_files() const;
  /// check_files(), throwing CheckpointError naming every bad file.
  void verify() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Cuts a unit's flat tensor into its named parameters by `layout` (copies, shaped).
/// Throws CheckpointError when an entry runs past the end of `flat`.
StateDict cut_by_layout(const torch::Tensor& flat, const std::vector<FlatLayoutEntry>& layout);

/// The whole model's state dict: every "param/<unit>" cut by its layout, plus every
/// "buffer/<name>" full tensor under <name>; what Module::state_dict() would hold.
StateDict consolidate_model(ShardedCheckpointReader& reader);

}  // namespace dtorch::checkpoint
