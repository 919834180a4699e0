// The run configuration of `dtorch train`: the settings, each declared once with its flag and
// documentation (the CLI's options and the JSON form <out>/config.json both come from that one
// list), the JSON form read back by `--config`, and the one function that derives defaults
// after every source has been read.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dtorch/checkpoint/save_format.h"
#include "dtorch/launch/signals.h"
#include "dtorch/parallel/pp/schedule.h"
#include "dtorch/report/progress.h"
#include "dtorch/train/config/job_size.h"
#include "dtorch/train/config/loader_config.h"
#include "dtorch/train/config/lr_schedule.h"
#include "dtorch/train/config/parallelism_config.h"
#include "dtorch/train/config/strategy_config.h"

namespace dtorch::train {
inline namespace config {

// Note [train's rooms]
// train/ has three rooms, each on those below it only: config/, the run's settings as plain
// structs with the DeepSpeed reader and the batch rule, so that reading and checking settings
// needs no communicator, mesh or strategy; strategy/, DDP and ZeRO behind one interface; and the
// loop at the top (parallelize(), the trainer, resuming, evaluating).
// Layering.TrainsRoomsIncludeNothingAboveThem checks it.
// Each room's namespace is an inline namespace of dtorch::train, as std::literals is of std: a
// name is declared in its room (dtorch::train::config::TrainConfig), and dtorch's API keeps one
// spelling for it, dtorch::train::TrainConfig, in programs and the loop alike. A forward
// declaration names the room (`namespace dtorch::train { inline namespace config { struct
// TrainConfig; } }`); without it, it declares another TrainConfig.

// Note [The run configuration's tree]
// A run's settings are a tree of plain structs, one per part of the run, each the one home of
// its settings: what parallelize() takes (ParallelismConfig, StrategyConfig with its optimizer
// and precision) is the same struct the run configuration holds, and `dtorch bench memory`
// and C++ programs fill in the same ones. The JSON form (<out>/config.json) groups the same
// settings by section as users think of them (visit_fields below says which section holds
// which field): the strategy's optimizer and precision are its sections "optimizer" and
// "precision", the data-parallel strategy sits in "parallelism" beside tp and pp, and the
// learning-rate schedule and clipping, which the loop applies, in "optimizer".

/// Which model (section "model").
struct ModelConfig {
  std::string name = "mnist-cnn";  ///< a name from models::model_names()
  int64_t seq_len = 0;             ///< text: tokens per window (0: the model's maximum, at most 64)
};

/// What the run trains and evaluates on (section "data").
struct DataConfig {
  /// fashion-mnist or mnist (IDX files in `dir`), cifar10:DIR or imagefolder:DIR for image
  /// models (train/train_data.h); text or text:PATH (byte tokens; default corpus: Debian's
  /// fortunes) for language models (gpt-*).
  std::string source = "fashion-mnist";
  std::string dir;            ///< empty: Debian's dataset-fashion-mnist folder
  int64_t train_samples = 0;  ///< use the first N training samples (0: all; "all" as a flag)
  int64_t test_samples = 0;   ///< evaluate on the first N test samples (0: all; "all" as a flag)
  LoaderConfig loader;        ///< loader threads, image size, augmentation, unreadable images
};

/// The loop (section "training"; the schedule and clipping are in section "optimizer").
struct TrainingConfig {
  int epochs = 2;
  int64_t batch_size = 64;  ///< samples per rank per step (under --pp, split into micro-batches)
  int accum_steps = 1;      ///< batches per optimizer step (no_sync for all but last)
  uint64_t seed = 1;        ///< model init and data order
  int threads = 0;          ///< intra-op threads per rank (0: leave as is)
  LrScheduleConfig lr_schedule;  ///< every optimizer step's rate, peaking at the optimizer's lr
  double clip_grad_norm = 0;     ///< clip the whole gradient to this norm (0: off)
};

/// Where the run writes (section "checkpointing").
struct CheckpointingConfig {
  std::string out = "runs/latest";  ///< config.json, metrics.jsonl, checkpoints, model.pt
  /// The final model file: pt (model.pt, torch.load) or safetensors (model.safetensors).
  checkpoint::SaveFormat save_format = checkpoint::SaveFormat::Torch;
  int keep = 2;  ///< the newest checkpoints kept in `out`
  /// Write each checkpoint on a thread while training goes on (Note [Checkpoints in the
  /// background] in train/background_save.h).
  bool async_save = false;
  bool resume = false;  ///< continue from the newest good checkpoint in `out`
  /// Replace the run `out` holds (Note [One run per folder] in train/run_folder.h).
  bool overwrite = false;
  /// The signal that makes every rank checkpoint after an agreed step and exit 75 (Note
  /// [Checkpoint on a signal] in train/preemption.h).
  launch::CheckpointSignal checkpoint_signal = launch::CheckpointSignal::Usr1;
};

/// What the run tells as it goes (section "reporting").
struct ReportingConfig {
  report::ProgressConfig progress;
  /// A log line and a "step" record in metrics.jsonl every this many optimizer steps (loss,
  /// learning rate, samples/s; 0: per epoch only). DeepSpeed's steps_per_print.
  int64_t print_every = 0;
  /// Time the phases of every step (data, forward, backward, optimizer step: their means go
  /// into the epoch's log line and records). DeepSpeed's wall_clock_breakdown.
  bool phase_times = false;
  /// Optimizer steps to trace with LibTorch's profiler, as FIRST:LAST (1-based, inclusive),
  /// into <out>/trace.rank<N>.json (report/profiler.h). Empty: none.
  std::string profile;
  /// A folder for TensorBoard event files (rank 0's): every optimizer step's loss and lr,
  /// every epoch's record (report/tensorboard.h). Empty: none.
  std::string tensorboard;
};

/// Every setting of a training run. Note [The run configuration's tree]
struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  /// Tensor, sequence and pipeline parallelism and recomputation (train/parallelize.h).
  ParallelismConfig parallelism;
  /// ddp | zero1 | zero2 | zero3 over the remaining data-parallel ranks, with its optimizer and
  /// precision (its `model` and `input` are filled in by parallelize()).
  StrategyConfig strategy;
  CheckpointingConfig checkpointing;
  ReportingConfig reporting;
};

/// Throws ConfigError naming the first bad field, its flag and the fix.
void validate(const TrainConfig& c);

// ---------------------------------------------------------------------------------------------
// The fields. Note [One list of settings]
// Every setting a user can give is declared once below, with its section of the JSON form, its
// flag (without the dashes; the same word is its JSON key) and its documentation. A visitor
// walks the list: tools/ declares the CLI's options from it (the documentation is the help,
// the section the option group), to_json and from_json write and read <out>/config.json with
// it, and `--config` merges a file with the flags given through it. A new setting is one line
// here and appears in all of them; no other place spells a setting's name.
// `resume` and `overwrite` are not settings of the run but of the invocation (flags of their
// own), and the sources that resolve() reads (--global-batch-size, --deepspeed-config,
// --config, the job's size) are not settings either: config.json holds what they resolved to.

/// One field: its section of the JSON form (and the CLI's option group), its flag without the
/// dashes (also its JSON key), its help, and the value the flag takes when given alone
/// (nullptr: it needs one). A closed set's field is an enum, visited as Named.
struct Field {
  const char* section;
  const char* flag;
  const char* doc;
  const char* alone = nullptr;
};

/// A field held as an enum (Note [Closed sets] in core/enum_names.h): its value, read and
/// written by name.
template <class E>
struct Named {
  E& value;
  std::vector<std::string> choices() const { return names_of<E>(); }
  const std::string& name() const { return name_of(value); }
  void set(const std::string& name) {
    if (auto v = value_named<E>(name)) value = *v;
  }
};
template <class E>
Named<E> named(E& value) {
  return Named<E>{value};
}

/// A count whose 0 is a word, read and written as the word or a whole number: `--train-samples
/// all`, "train-samples": "all"; `--dp-replicate auto`.
struct CountOr {
  int64_t& value;
  const char* word;
};
inline CountOr all_or(int64_t& value) {
  return CountOr{value, "all"};
}
inline CountOr auto_or(int64_t& value) {
  return CountOr{value, "auto"};
}

/// `text` as a CountOr count: `word` is 0, else a whole number >= 0; ConfigError naming `flag`,
/// the text and the fix otherwise.
int64_t parse_count_or(const std::string& text, const std::string& flag, const std::string& word);

/// The sections of the JSON form, in the order the fields below first name them.
const std::vector<std::string>& config_sections();

/// The loader's settings (`dtorch train` and `dtorch bench data`).
template <class V>
void visit_fields(LoaderConfig& l, V&& v) {
  v(Field{"data", "data-workers",
          "threads that decode and prepare the next batches while one trains (0: the training "
          "thread prepares each batch)"},
    l.workers);
  v(Field{"data", "image-size",
          "cifar10 and imagefolder: side of the square images the model takes; images are "
          "resized (shorter side) and centre-cropped to it (0: 32)"},
    l.image_size);
  v(Field{"data", "augment",
          "auto | crop-flip (random crop with padding and horizontal flip while training) | "
          "none; auto: crop-flip for cifar10 and imagefolder, none for MNIST"},
    named(l.augment));
  v(Field{"data", "bad-images",
          "fail | skip: an unreadable or truncated image stops the run naming the file, or is "
          "left out of its batch with a warning"},
    named(l.bad_images));
}

/// The strategy's settings (`dtorch train` and `dtorch bench memory`).
template <class V>
void visit_fields(StrategyConfig& s, V&& v) {
  v(Field{"parallelism", "strategy",
          "ddp | zero1 (sharded optimizer state) | zero2 (+ gradients) | zero3 (+ parameters: "
          "FSDP)"},
    named(s.kind));
  v(Field{"parallelism", "device",
          "cpu | cuda (one GPU per rank, by LOCAL_RANK) | auto (cuda when this LibTorch has CUDA "
          "and a GPU is visible)"},
    named(s.device));
  v(Field{"parallelism", "bucket-cap-mb", "gradient bucket size (ddp), unit size (zero1, zero2)"},
    s.ddp.bucket_cap_mb);
  v(Field{"parallelism", "min-unit-params",
          "zero3 wrap policy: merge consecutive blocks into units of at least this many "
          "parameters (0: one unit per block)"},
    s.min_unit_params);
  v(Field{"parallelism", "reshard-root-after-forward",
          "zero3: release the parameters outside blocks (embeddings, head) when forward ends and "
          "gather them again for backward: the ZeRO paper's 3x parameter bytes (default: keep "
          "them from forward to the end of their backward, as FSDP keeps its root)"},
    s.reshard_root_after_forward);
  v(Field{"parallelism", "reshard-after-microbatch",
          "zero3 with --pp: release each unit after every micro-batch's forward and backward "
          "(less memory, two gathers per micro-batch; --schedule 1f1b or gpipe). Default: gather "
          "the stages' units once per step"},
    s.reshard_after_microbatch);
  v(Field{"parallelism", "offload-optimizer",
          "zero1-3: where the optimizer's state lives: none | cpu (host memory; on --device cpu "
          "it is there already) | nvme (a file per rank in --offload-dir between steps, read in "
          "piece by piece for the step: ZeRO-Infinity)"},
    named(s.offload.optimizer));
  v(Field{"parallelism", "offload-params",
          "zero3: where the parameter shards live: none | cpu (host memory; on --device cpu "
          "they are there already) | nvme (a file per rank in --offload-dir, each shard paged "
          "in for its gather and its step; needs --offload-optimizer nvme: ZeRO-Infinity)"},
    named(s.offload.params));
  v(Field{"parallelism", "offload-dir",
          "--offload-optimizer/--offload-params nvme: the folder of each rank's files, on a "
          "fast local disk (they are removed when the run ends)"},
    s.offload.dir);
  v(Field{"parallelism", "offload-buffers",
          "--offload-optimizer nvme: host buffers for state in flight: the next piece of a shard "
          "read ahead and the last written behind while one steps"},
    s.offload.buffers);
  v(Field{"parallelism", "offload-buffer-mb",
          "--offload-optimizer nvme: each buffer's MiB; a shard steps in pieces of this size, "
          "so a rank holds --offload-buffers of them, not its largest shard's state"},
    s.offload.buffer_mb);
  v(Field{"parallelism", "find-unused-parameters",
          "ddp: allow parameters without gradient in a step"},
    s.ddp.find_unused_parameters);
  v(Field{"parallelism", "grad-compression", "ddp: none | fp16 | bf16"}, named(s.ddp.compression));
  v(Field{"checkpointing", "checkpoint-layout",
          "ddp: file (rank 0 writes one .dtc) | sharded (every rank writes its share of the "
          "replicated state at once) | auto (sharded from 64 MiB of parameters and optimizer "
          "state on 2 or more ranks; zero1-3 always write shards)"},
    named(s.checkpoint_layout));
  v(Field{"precision", "precision",
          "fp32 | bf16 (bf16 compute, fp32 master weights) | fp16 (fp16 compute, fp32 master "
          "weights; on the CPU with LibTorch 2.x; dynamic loss scaling, --loss-scale)"},
    named(s.precision.compute));
  // DeepSpeed's "fp16" block, key for key (Note [Loss scaling]).
  auto& ls = s.precision.loss_scale;
  v(Field{"precision", "loss-scale",
          "fp16: 0 scales the loss dynamically; a value > 0 is a static scale"},
    ls.loss_scale);
  v(Field{"precision", "initial-scale-power", "fp16: the dynamic loss scale starts at 2^this"},
    ls.initial_scale_power);
  v(Field{"precision", "loss-scale-window",
          "fp16: steps without overflow before the dynamic loss scale doubles"},
    ls.loss_scale_window);
  v(Field{"precision", "hysteresis",
          "fp16: overflows absorbed (steps skipped) before the dynamic loss scale halves"},
    ls.hysteresis);
  v(Field{"precision", "consecutive-hysteresis",
          "fp16: every step without overflow refills --hysteresis (default: only a doubling of "
          "the scale does)"},
    ls.consecutive_hysteresis);
  v(Field{"precision", "min-loss-scale",
          "fp16: the dynamic loss scale never halves below this; an overflow there stops the "
          "run"},
    ls.min_loss_scale);
  v(Field{"precision", "reduce-dtype", "gradient reduction dtype: fp32 | bf16"},
    named(s.precision.reduce_dtype));
  v(Field{"optimizer", "optimizer", "sgd (with --momentum) | adam | adamw"},
    named(s.optimizer.kind));
  v(Field{"optimizer", "lr", "learning rate (a schedule's peak)"}, s.optimizer.lr);
  v(Field{"optimizer", "momentum", "sgd momentum"}, s.optimizer.momentum);
  v(Field{"optimizer", "weight-decay",
          "weight decay (default: 0.01 for adamw, 0 for sgd and adam)"},
    s.optimizer.weight_decay);
  v(Field{"optimizer", "betas", "adam and adamw: beta1,beta2"}, s.optimizer.betas);
  v(Field{"optimizer", "eps", "adam and adamw: added to the denominator"}, s.optimizer.eps);
}

/// How the model is spread besides its strategy (`dtorch train` and `dtorch bench memory`).
template <class V>
void visit_fields(ParallelismConfig& p, V&& v) {
  v(Field{"parallelism", "tp",
          "tensor-parallel ranks per model replica (gpt-*, vit-*): consecutive ranks split every "
          "layer; the strategy runs over the rest (dp = world / tp)"},
    p.tp);
  v(Field{"parallelism", "sequence-parallel",
          "with --tp: also split norms and residuals along the sequence"},
    p.sequence_parallel);
  v(Field{"parallelism", "cp",
          "context-parallel ranks per model replica (gpt-*, vit-*): each holds 1/cp of every "
          "sequence "
          "(a head and a tail chunk) and attention spans them; the strategy reduces gradients "
          "over dp x cp (dp = world / (tp x cp x pp))"},
    p.cp);
  v(Field{"parallelism", "cp-kind",
          "with --cp: ring (keys and values passed around the group) | ulysses (all-to-all "
          "from the sequence split to a head split; the heads must divide by cp)"},
    named(p.cp_kind));
  v(Field{"parallelism", "dp-replicate",
          "zero1-3: hybrid sharding (HSDP): the data-parallel ranks form this many replicas of "
          "consecutive ranks, each sharding the model over its own ranks; gradient shards are "
          "averaged across the replicas, so only they cross between replicas (auto: one replica "
          "a node)"},
    auto_or(p.dp_replicate));
  v(Field{"parallelism", "pp",
          "pipeline ranks (gpt-*, resnet*, vit-*): each builds and runs one stage (two under "
          "--schedule interleaved); the strategy runs over the rest (dp = world / (tp x cp x "
          "pp))"},
    p.pp);
  v(Field{"parallelism", "microbatches",
          "with --pp: micro-batches per batch (default 2 x pp, or the most below that which "
          "divides the batch)"},
    p.microbatches);
  v(Field{"parallelism", "schedule",
          "with --pp: gpipe | 1f1b | interleaved (1F1B over 2 stages per rank) | zb (zero-bubble "
          "ZB-H1)"},
    named(p.schedule));
  v(Field{"parallelism", "pp-split",
          "with --pp: units where stages 1.. begin, e.g. transformer.h.6 (default: balanced by "
          "parameter count; `dtorch pipeline show` lists the units)"},
    p.pp_split);
  v(Field{"model", "activation-checkpointing",
          "recompute every K-th block's forward in backward instead of keeping its activations "
          "(given alone: every block)",
          "1"},
    p.activation_checkpointing);
}

/// Every setting of a training run.
template <class V>
void visit_fields(TrainConfig& c, V&& v) {
  v(Field{"model", "model",
          "mnist-cnn | mnist-mlp | resnet18 | resnet50 | resnet-debug | vit-tiny | vit-debug | "
          "gpt-small | gpt-large | gpt-xl | gpt-debug | gpt-long"},
    c.model.name);
  v(Field{"model", "seq-len",
          "text: tokens per training sequence (default: the model's block size, at most 64)"},
    c.model.seq_len);
  v(Field{"data", "data",
          "fashion-mnist | mnist (IDX images), cifar10:DIR (CIFAR-10's binary files), "
          "imagefolder:DIR (DIR/<class>/*.jpg|png, or DIR/train and DIR/val so), text | "
          "text:PATH (byte tokens, for gpt-*; default corpus: Debian's fortunes)"},
    c.data.source);
  v(Field{"data", "data-dir",
          "folder with the IDX files (default: where Debian's dataset-fashion-mnist puts them)"},
    c.data.dir);
  v(Field{"data", "train-samples", "use only the first N training samples, or all"},
    all_or(c.data.train_samples));
  v(Field{"data", "test-samples", "evaluate on the first N test samples, or all"},
    all_or(c.data.test_samples));
  visit_fields(c.data.loader, v);
  v(Field{"training", "epochs", "passes over the training data"}, c.training.epochs);
  v(Field{"training", "batch-size",
          "samples per rank per step (under --pp: split into --microbatches)"},
    c.training.batch_size);
  v(Field{"training", "accum-steps", "batches per optimizer step"}, c.training.accum_steps);
  v(Field{"training", "seed", "model initialisation and data order"}, c.training.seed);
  v(Field{"training", "threads", "intra-op threads per rank (0: default)"}, c.training.threads);
  visit_fields(c.parallelism, v);
  visit_fields(c.strategy, v);
  v(Field{"optimizer", "clip-grad-norm", "clip the whole gradient to this norm (0: off)"},
    c.training.clip_grad_norm);
  v(Field{"optimizer", "lr-schedule",
          "constant | warmup-linear | warmup-cosine | onecycle (as PyTorch's LinearLR, "
          "CosineAnnealingLR and OneCycleLR), over the whole run's optimizer steps; DeepSpeed's "
          "WarmupLR | WarmupDecayLR | WarmupCosineLR | OneCycle come with a --deepspeed-config "
          "scheduler"},
    named(c.training.lr_schedule.kind));
  v(Field{"optimizer", "warmup-steps",
          "optimizer steps of linear warm-up to --lr (onecycle: of rising; 0 there: 30% of the "
          "run)"},
    c.training.lr_schedule.warmup_steps);
  v(Field{"optimizer", "min-lr",
          "where warmup-linear, warmup-cosine and onecycle end (onecycle 0: lr / 25e4)"},
    c.training.lr_schedule.min_lr);
  v(Field{"checkpointing", "out",
          "output folder: config.json, metrics.jsonl, checkpoints, model.pt"},
    c.checkpointing.out);
  v(Field{"checkpointing", "save-format",
          "final model file: pt (model.pt for torch.load) or safetensors (model.safetensors)"},
    named(c.checkpointing.save_format));
  v(Field{"checkpointing", "keep-checkpoints", "the newest checkpoints kept in --out"},
    c.checkpointing.keep);
  v(Field{"checkpointing", "async-checkpoint",
          "write each checkpoint in the background while training goes on (its state copied "
          "to host memory first; the run waits for the last one before it exits)"},
    c.checkpointing.async_save);
  v(Field{"checkpointing", "checkpoint-signal",
          "USR1 | USR2 | off: on this signal (Slurm's #SBATCH --signal=USR1@90) every rank "
          "finishes an agreed step, checkpoints and exits 75; the run resumes from it"},
    named(c.checkpointing.checkpoint_signal));
  v(Field{"reporting", "progress", "auto | bar | lines | off"}, named(c.reporting.progress.mode));
  v(Field{"reporting", "print-every",
          "a log line and a \"step\" record in metrics.jsonl every N optimizer steps (loss, lr, "
          "samples/s)"},
    c.reporting.print_every);
  v(Field{"reporting", "phase-times",
          "time each step's phases (data, forward, backward, step): means per step in the log "
          "lines and metrics.jsonl"},
    c.reporting.phase_times);
  v(Field{"reporting", "profile",
          "trace optimizer steps FIRST:LAST with LibTorch's profiler into "
          "<out>/trace.rank<N>.json (open it at ui.perfetto.dev)"},
    c.reporting.profile);
  v(Field{"reporting", "tensorboard",
          "write TensorBoard event files into DIR: each optimizer step's loss and lr, each "
          "epoch's record"},
    c.reporting.tensorboard);
}

/// The JSON form: {"model": {"model": "gpt-debug", "seq-len": 32, ...}, "data": {...}, ...},
/// every field, by section (config_sections()); a DeepSpeed learning-rate schedule's
/// parameters under optimizer.deepspeed-schedule.
nlohmann::json to_json(const TrainConfig& c);

/// `base` with the fields `j` gives (a config.json, or part of one); their flags ("--lr") go
/// into *given when it is given. Every key is checked: an unknown section or field is a
/// ConfigError naming the nearest known one, a value of the wrong type or outside its choices
/// names its key and `file`.
TrainConfig from_json(const nlohmann::json& j, const std::string& file,
                      const TrainConfig& base = {}, std::set<std::string>* given = nullptr);

// Note [The job's size in config.json]
// A run's config.json holds, beside its settings, the size of the job that trained it (section
// "job": nnodes, nproc-per-node, world-size). It is a source, as --global-batch-size is, not a
// setting: the launch decides it. `dtorch train --config FILE` started by hand without
// --nproc-per-node reruns at that size (one node: it starts that many ranks; several: it says
// how to start them). At another size (--nproc-per-node given, or an outside launcher's job of
// another size) the data-parallel ranks change, and with them the batch of an optimizer step:
// the run keeps the file's global batch by the batch rule (train/config/batch_sizes.h) when no
// batch flag is given, or, when the new size does not divide it, keeps the batch per rank, and says
// before the first step which it did and why (tools/cmd_train.cpp).

/// The file `--config` names, read by from_json; the flags it sets go into *keys (as --lr is),
/// the job's size (Note [The job's size in config.json]) into *job. ConfigError for a "job"
/// section whose numbers are not whole, positive and nnodes x nproc-per-node = world-size.
TrainConfig read_config_file(const std::string& path, std::set<std::string>* keys = nullptr,
                             JobSize* job = nullptr);

/// What config.json holds: to_json(c) and, when known, the job's size.
nlohmann::json config_file_json(const TrainConfig& c, const JobSize& job);

/// Writes config_file_json(c, job) to `path` (its folder made if need be; the file replaced
/// whole, or not at all). CheckpointError when it cannot.
void write_config_file(const TrainConfig& c, const JobSize& job, const std::string& path);

/// `file` with the fields whose flags ("--lr") are in `flags` taken from `flags_config`
/// instead: what `--config FILE` plus the flags given on the command line ask for.
TrainConfig overlay_flags(const TrainConfig& file, const TrainConfig& flags_config,
                          const std::set<std::string>& flags);

// Note [Micro-batches]
// Under a pipeline the batch of a rank (--batch-size) is cut into --microbatches micro-batches,
// and the gradients of all of them make one optimizer step: they are what accumulation steps
// are without a pipeline (so --accum-steps stays 1, and DeepSpeed's gradient_accumulation_steps
// is the micro-batch count, as in DeepSpeed's pipeline engine). Left out, the count is 2 x pp
// (every stage busy in 1F1B's steady state), or, when that does not divide the batch, the most
// below it that does (a multiple of pp for the interleaved schedule); a batch no count fits is
// an error naming it. A count given is never changed: a batch it does not divide is an error.

/// What resolve() reads besides the configuration itself.
struct ConfigSources {
  /// The flags the user gave ("--lr"): on the command line and in a --config file. A value
  /// given is never replaced; a default that would have to be is an error naming both.
  std::set<std::string> given;
  /// The flags given on the command line only: they win over --deepspeed-config's keys.
  std::set<std::string> command_line;
  int64_t global_batch_size = 0;  ///< --global-batch-size (0: not given)
  std::string deepspeed_config;   ///< --deepspeed-config FILE (empty: none)
  int world_size = 1;             ///< ranks of the job
  /// --config FILE's settings and the size of the job that wrote it (nullptr: no --config).
  const TrainConfig* config_file = nullptr;
  std::string config_file_name;
  JobSize config_file_job;
};

/// What resolve() says: the DeepSpeed file's warnings, and how each source was applied.
struct Resolution {
  std::vector<std::string> warnings;
  std::vector<std::string> notes;
};

/// Derives every default that depends on another setting or on a source, in one place and
/// after all of them are read: the DeepSpeed file's settings (flags given win), the batch per
/// rank and accumulation steps or micro-batches from --global-batch-size (DeepSpeed's rule,
/// Note [Micro-batches]) or from a --config file's run at another size (Note [The job's size
/// in config.json]), the micro-batch count under --pp, the optimizer's weight decay. Then
/// validates. Throws ConfigError for conflicts, naming both values and where they came from.
Resolution resolve(TrainConfig& c, const ConfigSources& sources);

/// The micro-batches Note [Micro-batches] gives a batch of `batch` samples per rank for `pp`
/// stages and pipeline schedule `schedule` when none is given.
int default_microbatches(int pp, pp::ScheduleKind schedule, int64_t batch);

}  // namespace config
}  // namespace dtorch::train
