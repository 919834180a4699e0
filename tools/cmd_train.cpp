// `dtorch train`: the training job from the command line. Runs alone, under `dtorch launch`
// or torchrun, or (with --nproc-per-node N) launches N copies of itself.

#include "dtorch/core/env.h"
#include "dtorch/core/log.h"
#include "dtorch/data/mnist_dataset.h"
#include "dtorch/launch/launcher.h"
#include "dtorch/launch/rank_info.h"
#include "dtorch/train/deepspeed_config.h"
#include "dtorch/train/trainer.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct TrainFlags {
  train::TrainConfig config;
  int nproc_per_node = 0;
  std::string log_dir;   // with nproc_per_node: the launcher's --log-dir
  int max_restarts = 0;  // with nproc_per_node: the launcher's --max-restarts
  std::string progress = "auto";
  std::string deepspeed_config;   // a ds_config.json (Note [DeepSpeed configuration])
  int64_t global_batch_size = 0;  // samples per optimizer step over the data-parallel ranks
};

// --global-batch-size: the per-rank batch (and accumulation steps) follow the job's size, by
// DeepSpeed's rule, so an elastic job that goes on with fewer nodes takes the same optimizer
// steps over the same samples (the sampler strides the epoch's order over the ranks).
void apply_global_batch(TrainFlags& f, const SelfLaunch& how, const std::set<std::string>& given) {
  auto& c = f.config;
  const int dp = std::max(1, job_world_size(how) / std::max(1, c.tp * c.pp));
  auto given_or_none = [&](const char* flag, int64_t v) {
    return given.count(flag) ? std::optional<int64_t>(v) : std::nullopt;
  };
  train::set_batch_sizes(
      train::resolve_batch_sizes(f.global_batch_size, given_or_none("--batch-size", c.batch_size),
                                 given_or_none("--accum-steps", c.accum_steps), dp,
                                 {"--global-batch-size", "--batch-size", "--accum-steps"}),
      c);
  if (reports_for_the_job(how)) {
    log::info("--global-batch-size ", f.global_batch_size, ": batch ", c.batch_size, " per rank x ",
              c.accum_steps, " accumulation step(s) x ", dp, " data-parallel rank(s)");
  }
}

// The DeepSpeed configuration file under the flags given (which win), for a job of the size
// this process can tell before it starts (DeepSpeed's batch rule needs it).
void apply_deepspeed_file(TrainFlags& f, const SelfLaunch& how,
                          const std::set<std::string>& given) {
  const auto ds = train::read_deepspeed_config(f.deepspeed_config);
  const auto notes = train::apply_deepspeed_config(ds, given, job_world_size(how), f.config);
  if (!reports_for_the_job(how)) return;
  for (const auto& w : ds.warnings)
    log::warn(w);
  for (const auto& n : notes)
    log::info(n);
  const auto& c = f.config;
  log::info("--deepspeed-config ", f.deepspeed_config, ": ", c.strategy.kind, ", ",
            c.strategy.precision, ", ", c.strategy.optimizer, " lr ", c.strategy.lr, ", batch ",
            c.batch_size, " per rank x ", c.accum_steps, " accumulation step(s), schedule ",
            c.lr_schedule.kind);
}

int run_train(TrainFlags& f, const std::set<std::string>& given) {
  auto& c = f.config;
  using Mode = train::ProgressConfig::Mode;
  c.progress.mode = f.progress == "bar"     ? Mode::Bar
                    : f.progress == "lines" ? Mode::Lines
                    : f.progress == "off"   ? Mode::Off
                                            : Mode::Auto;
  SelfLaunch how;  // Note [Self-launch]
  how.nproc_per_node = f.nproc_per_node;
  how.log_dir = f.log_dir;
  how.max_restarts = f.max_restarts;
  if (!f.deepspeed_config.empty()) apply_deepspeed_file(f, how, given);
  if (f.global_batch_size > 0) apply_global_batch(f, how, given);
  train::validate(c);  // fail before launching anything
  if (auto code = self_launch(how)) return *code;
  auto comm = comm::Communicator::from_env();
  train::train(c, comm);
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<TrainFlags>();
  auto& c = f->config;
  auto* cmd = app.add_subcommand(
      "train",
      "Train a model data-parallel (DDP or ZeRO-1/2/3), optionally x tensor-parallel (--tp) or "
      "pipeline-parallel (--pp)");
  cmd->add_option("--model", c.model,
                  "mnist-cnn | mnist-mlp | resnet18 | resnet50 | resnet-debug | vit-tiny | "
                  "vit-debug | gpt-small | gpt-large | gpt-debug")
      ->capture_default_str();
  cmd->add_option("--data", c.data,
                  "fashion-mnist | mnist (IDX images), cifar10:DIR (CIFAR-10's binary files), "
                  "imagefolder:DIR (DIR/<class>/*.jpg|png, or DIR/train and DIR/val so), text "
                  "| text:PATH (byte tokens, for gpt-*; default corpus: Debian's fortunes)")
      ->capture_default_str();
  cmd->add_option("--tp", c.tp,
                  "tensor-parallel ranks per model replica (gpt-*, vit-*): consecutive ranks "
                  "split every layer; the strategy runs over the rest (dp = world / tp)")
      ->capture_default_str();
  cmd->add_flag("--sequence-parallel", c.sequence_parallel,
                "with --tp: also split norms and residuals along the sequence");
  cmd->add_option("--pp", c.pp,
                  "pipeline ranks (gpt-*, resnet*, vit-*): each builds and runs one stage (two "
                  "under --schedule interleaved); the strategy (ddp, zero1 or zero2) runs over "
                  "the rest (dp = world / pp)")
      ->capture_default_str();
  cmd->add_option("--microbatches", c.microbatches,
                  "with --pp: micro-batches per batch (default 2 x pp)");
  cmd->add_option("--schedule", c.schedule,
                  "with --pp: gpipe | 1f1b | interleaved (1F1B over 2 stages per rank) | zb "
                  "(zero-bubble ZB-H1)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "zb", "interleaved"}))
      ->capture_default_str();
  cmd->add_option("--pp-split", c.pp_split,
                  "with --pp: units where stages 1.. begin, e.g. transformer.h.6 (default: "
                  "balanced by parameter count; `dtorch pipeline show` lists the units)");
  cmd->add_option("--clip-grad-norm", c.clip_grad_norm,
                  "clip the whole gradient to this norm (0: off)");
  cmd->add_option("--activation-checkpointing", c.activation_checkpointing,
                  "recompute every K-th block's forward in backward instead of keeping its "
                  "activations (given alone: every block)")
      ->expected(0, 1)
      ->default_str("1");
  cmd->add_option("--seq-len", c.seq_len,
                  "text: tokens per training sequence (default: the model's block size, at "
                  "most 64)");
  cmd->add_option(
      "--data-dir", c.data_dir,
      std::string("folder with the IDX files (default ") + data::kDefaultMnistDir + ")");
  add_strategy_options(cmd, c.strategy);
  add_loader_options(cmd, c.loader);
  cmd->add_option("--epochs", c.epochs)->capture_default_str();
  cmd->add_option("--batch-size", c.batch_size, "samples per rank per step")->capture_default_str();
  cmd->add_option("--global-batch-size", f->global_batch_size,
                  "samples per optimizer step over all data-parallel ranks (DeepSpeed's "
                  "train_batch_size): the batch per rank follows the job's size, so an elastic "
                  "job keeps its steps when nodes come and go")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--lr-schedule", c.lr_schedule.kind,
                  "constant | warmup-linear | warmup-cosine | onecycle (as PyTorch's LinearLR, "
                  "CosineAnnealingLR and OneCycleLR), over the whole run's optimizer steps")
      ->check(CLI::IsMember({"constant", "warmup-linear", "warmup-cosine", "onecycle"}))
      ->capture_default_str();
  cmd->add_option("--warmup-steps", c.lr_schedule.warmup_steps,
                  "optimizer steps of linear warm-up to --lr (onecycle: of rising; 0 there: 30% "
                  "of the run)")
      ->capture_default_str();
  cmd->add_option("--min-lr", c.lr_schedule.min_lr,
                  "where warmup-linear, warmup-cosine and onecycle end (onecycle 0: lr / 25e4)")
      ->capture_default_str();
  cmd->add_option("--seed", c.seed)->capture_default_str();
  cmd->add_option("--out", c.out, "output folder: metrics.jsonl, checkpoints, model.pt")
      ->capture_default_str();
  cmd->add_option("--save-format", c.save_format,
                  "final model file: pt (model.pt for torch.load) or safetensors "
                  "(model.safetensors)")
      ->capture_default_str();
  cmd->add_flag("--resume", c.resume, "continue from the newest good checkpoint in --out");
  cmd->add_option("--nproc-per-node,--nproc_per_node", f->nproc_per_node,
                  "launch this many local ranks (like `dtorch launch --standalone`)");
  cmd->add_option("--max-restarts", f->max_restarts,
                  "with --nproc-per-node: restart the group this many times after a failure; it "
                  "resumes from the newest checkpoint in --out");
  cmd->add_option("--log-dir", f->log_dir,
                  "with --nproc-per-node: also write each rank's output to DIR/rank<rank>.log");
  cmd->add_option("--accum-steps", c.accum_steps, "batches per optimizer step")
      ->capture_default_str();
  cmd->add_option("--threads", c.threads, "intra-op threads per rank (0: default)");
  cmd->add_option("--train-samples", c.train_samples, "use only the first N training samples");
  cmd->add_option("--test-samples", c.test_samples, "evaluate on the first N test samples");
  cmd->add_option("--keep-checkpoints", c.keep_checkpoints)->capture_default_str();
  cmd->add_option("--progress", f->progress, "auto | bar | lines | off")
      ->check(CLI::IsMember({"auto", "bar", "lines", "off"}))
      ->capture_default_str();
  cmd->add_option("--print-every", c.print_every,
                  "a log line and a \"step\" record in metrics.jsonl every N optimizer steps "
                  "(loss, lr, samples/s)");
  cmd->add_flag("--phase-times", c.phase_times,
                "time each step's phases (data, forward, backward, step): means per step in "
                "the log lines and metrics.jsonl");
  cmd->add_option("--tensorboard", c.tensorboard,
                  "write TensorBoard event files into DIR: each optimizer step's loss and lr, "
                  "each epoch's record");
  cmd->add_option("--deepspeed-config,--deepspeed_config", f->deepspeed_config,
                  "a DeepSpeed ds_config.json: its batch sizes, zero_optimization, bf16, "
                  "optimizer, scheduler, gradient_clipping, steps_per_print and "
                  "wall_clock_breakdown; flags given here win (docs/deepspeed-config.md)");
  cmd->callback([f, cmd, &exit_code] { exit_code = run_train(*f, flags_given(*cmd)); });
}

}  // namespace dtorch::tools
