// Training checkpoints: one self-checking file per epoch in a directory, written atomically,
// the newest K kept, so a job killed at any moment resumes from its last good epoch.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtorch/checkpoint/state_dict.h"

namespace dtorch::checkpoint {

/// Note [Checkpoint format]: DIR/checkpoint-NNNNNN.dtc (NNNNNN = epochs completed) holds
///   8 bytes magic "DTORCHCK", uint32 format version, uint64 payload length,
///   uint32 CRC32 (zlib) of the payload, then the payload
/// (integers little-endian). The length and CRC catch truncation and corruption before
/// anything is parsed. The payload is a torch.save-format pickle of a dict with "model"
/// (name -> tensor), "optimizer" (torch::serialize archive bytes, uint8 tensor, or None),
/// "optimizer_type" (C++ class name, e.g. "torch::optim::SGD", when there is one), "epoch",
/// "global_step", "rng_state" (the default CPU generator, uint8 tensor) and "metadata"
/// (JSON text), so Python can read it: torch.load(io.BytesIO(open(f, "rb").read()[24:])).
inline constexpr uint32_t kCheckpointVersion = 1;

/// What a checkpoint records besides model and optimizer state.
struct CheckpointData {
  /// Epochs completed when it was written; the file is named after it, and a resumed run
  /// starts at this epoch (0-based).
  int64_t epoch = 0;
  /// Optimizer steps taken over the whole run so far.
  int64_t global_step = 0;
  /// A JSON object as text (model name, config, ...), stored and returned verbatim.
  std::string metadata_json = "{}";
};

/// A checkpoint that was read and applied.
struct LoadedCheckpoint {
  CheckpointData data;
  /// The file it came from.
  std::string path;
};

/// DIR/checkpoint-NNNNNN.dtc for `epoch`.
std::string checkpoint_path(const std::string& dir, int64_t epoch);

/// The epoch a checkpoint file's name gives (checkpoint_path's), or -1 for a path not so named.
int64_t checkpoint_epoch(const std::string& path);

/// Checkpoint files in `dir`, newest (highest epoch) first; other files, including the
/// temporaries of an interrupted save, are ignored. Empty when `dir` does not exist.
std::vector<std::string> list_checkpoints(const std::string& dir);

/// Writes the model's parameters and buffers, the optimizer's state (when not null), the
/// default CPU generator's state and `data` to checkpoint_path(dir, data.epoch), creating
/// `dir` if needed, atomically (temporary file in `dir`, fsync, rename, fsync of `dir`);
/// then deletes all but the newest `keep` checkpoints. A failed save throws CheckpointError
/// and leaves existing checkpoints untouched. Throws ConfigError when keep < 1 and
/// CheckpointError when metadata_json is not a JSON object. The same as
/// write_checkpoint_file(dir, checkpoint_file(checkpoint_state(data, model, optimizer, false)),
/// keep).
void save_checkpoint(const std::string& dir, const CheckpointData& data,
                     const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
                     int keep = 2);

/// What a checkpoint file holds, taken from a model and optimizer: the model's tensors in host
/// memory, the optimizer (its state and parameter groups) and the CPU generator's state.
struct CheckpointState {
  CheckpointData data;
  StateDict model;
  /// Null without one. Not owned unless the state is a copy.
  std::shared_ptr<const torch::optim::Optimizer> optimizer;
  torch::Tensor rng_state;
};

/// The state save_checkpoint writes. With `copy`, every tensor is copied (host_snapshot; the
/// optimizer's into a twin, parallel::snapshot_optimizer), so that the file can be made later,
/// on another thread, while the model and optimizer train on (Note [Checkpoints in the
/// background]); without, it refers to them, which must then stay as they are until the file
/// is made. Throws CheckpointError when metadata_json is not a JSON object or the epoch is
/// negative.
CheckpointState checkpoint_state(const CheckpointData& data, const torch::nn::Module& model,
                                 const torch::optim::Optimizer* optimizer, bool copy);

/// A checkpoint file's bytes, for write_checkpoint_file.
struct CheckpointFile {
  int64_t epoch = 0;
  std::vector<char> bytes;
};

/// The file save_checkpoint writes, made from `state`.
CheckpointFile checkpoint_file(const CheckpointState& state);

/// Writes `file` into `dir` and prunes, as save_checkpoint does.
void write_checkpoint_file(const std::string& dir, const CheckpointFile& file, int keep);

/// Reads the checkpoint at `path` and restores model, optimizer (when not null) and the
/// default CPU generator from it (every rank that loads it gets the writer's generator
/// state; reseed per rank afterwards if ranks need different streams). Throws CheckpointError when
/// the file is unreadable or corrupt, or was written for a different model (names or shapes differ)
/// or optimizer.
LoadedCheckpoint load_checkpoint(const std::string& path, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer);

/// The model state (parameters and buffers, by state_dict name) of the checkpoint file at
/// `path`, with its data; throws CheckpointError when it is unreadable or corrupt.
std::pair<StateDict, CheckpointData> read_checkpoint_model(const std::string& path);

/// Restores the newest good checkpoint in `dir` (of epoch `at_most` or before, when given). A
/// corrupt or truncated one is skipped with a warning naming it and why, falling back to the
/// one before. Returns nullopt when there are no checkpoints; throws CheckpointError naming
/// every file when none is readable, and when the newest readable one does not fit the model
/// or optimizer.
std::optional<LoadedCheckpoint> load_latest_checkpoint(
    const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
    std::optional<int64_t> at_most = std::nullopt);

}  // namespace dtorch::checkpoint
