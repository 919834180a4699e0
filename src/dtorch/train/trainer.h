// The training loop behind `dtorch train`: a registered model on an image dataset or a text,
// spread over the communicator's ranks by a strategy (DDP or ZeRO-1/2/3), with progress,
// per-epoch evaluation, metrics, checkpoints and resume. Rank 0 reports; every rank trains.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtorch/comm/communicator.h"
#include "dtorch/train/lr_schedule.h"
#include "dtorch/train/metrics.h"
#include "dtorch/train/progress.h"
#include "dtorch/train/strategy.h"
#include "dtorch/train/train_data.h"

namespace dtorch::train {

struct TrainConfig {
  std::string model = "mnist-cnn";  ///< a name from models::model_names()
  /// fashion-mnist or mnist (IDX files in data_dir), cifar10:DIR or imagefolder:DIR for image
  /// models (train/train_data.h); text or text:PATH (byte tokens; default corpus: Debian's
  /// fortunes) for language models (gpt-*).
  std::string data = "fashion-mnist";
  std::string data_dir;  ///< empty: Debian's dataset-fashion-mnist folder
  LoaderConfig loader;   ///< loader threads, image size, augmentation, unreadable images
  int64_t seq_len = 0;   ///< text: tokens per window (0: the model's maximum, at most 64)
  int epochs = 2;
  int64_t batch_size = 64;  ///< samples per rank per step
  /// ddp | zero1 | zero2 | zero3 over the data-parallel group, with the optimizer, its peak
  /// learning rate and the precision (its `model` is filled in from `model`).
  StrategyConfig strategy;
  LrScheduleConfig lr_schedule;  ///< every optimizer step's rate, peaking at strategy.lr
  /// Tensor-parallel ranks per model replica (gpt-*, vit-*); the strategy runs over the
  /// remaining data-parallel degree, world / tp (parallel/parallel_dims.h).
  int tp = 1;
  /// Megatron's sequence parallelism inside each tp group (needs tp > 1).
  bool sequence_parallel = false;
  /// Pipeline stages (gpt-*, resnet*, vit-*): each rank builds and runs one stage; the
  /// strategy (ddp or zero1) runs over world / pp data-parallel replicas.
  int pp = 1;
  int microbatches = 0;           ///< per batch, under --pp (0: 2 x pp)
  std::string schedule = "1f1b";  ///< gpipe | 1f1b | zb (pp::make_schedule)
  std::string pp_split;           ///< unit names where stages 1.. begin; empty: balanced
  double clip_grad_norm = 0;      ///< clip the whole gradient to this norm (0: off)
  /// Recompute every K-th block's forward in backward instead of keeping its activations
  /// (parallel/activation_checkpoint.h; 1: every block, 0: off).
  int activation_checkpointing = 0;
  uint64_t seed = 1;                ///< model init and data order
  std::string out = "runs/latest";  ///< metrics.jsonl, checkpoints, model.pt
  /// The final model file: pt (model.pt, torch.load) or safetensors (model.safetensors).
  std::string save_format = "pt";
  bool resume = false;        ///< continue from the newest good checkpoint in `out`
  int accum_steps = 1;        ///< batches per optimizer step (no_sync for all but last)
  int threads = 0;            ///< intra-op threads per rank (0: leave as is)
  int64_t train_samples = 0;  ///< use the first N training samples (0: all)
  int64_t test_samples = 0;   ///< evaluate on the first N test samples (0: all)
  int keep_checkpoints = 2;
  /// A log line and a "step" record in metrics.jsonl every this many optimizer steps (loss,
  /// learning rate, samples/s; 0: per epoch only). DeepSpeed's steps_per_print.
  int64_t print_every = 0;
  /// Time the phases of every step (data, forward, backward, optimizer step: their means go
  /// into the epoch's log line and records). DeepSpeed's wall_clock_breakdown.
  bool phase_times = false;
  /// A folder for TensorBoard event files (rank 0's): every optimizer step's loss and lr,
  /// every epoch's record (train/tensorboard.h). Empty: none.
  std::string tensorboard;
  ProgressConfig progress;
};

/// Throws ConfigError naming the first bad field and the fix.
void validate(const TrainConfig& c);

/// Trains and returns the record of every epoch run (all ranks get the same records).
std::vector<EpochRecord> train(const TrainConfig& c, std::shared_ptr<comm::Communicator> comm);

}  // namespace dtorch::train
