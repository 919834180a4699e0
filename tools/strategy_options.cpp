// The flags of train::StrategyConfig, declared once for every command that applies a strategy
// (`dtorch train`, `dtorch bench memory`): one option group, so both read and show the same.
#include "dtorch/train/strategy.h"
#include "tools/commands.h"

namespace dtorch::tools {

void add_strategy_options(CLI::App* cmd, train::StrategyConfig& s) {
  auto* g = cmd->add_option_group("Strategy", "how the model is spread and optimised");
  g->add_option("--strategy", s.kind,
                "ddp | zero1 (sharded optimizer state) | zero2 (+ gradients) | zero3 (+ "
                "parameters: FSDP)")
      ->check(CLI::IsMember({"ddp", "zero1", "zero2", "zero3"}))
      ->capture_default_str();
  g->add_option("--device", s.device,
                "cpu | cuda (one GPU per rank, by LOCAL_RANK) | auto (cuda when this LibTorch "
                "has CUDA and a GPU is visible)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  g->add_option("--precision", s.precision,
                "fp32 | bf16 (bf16 compute, fp32 master weights) | fp16 (fp16 compute, fp32 "
                "master weights; on the CPU with LibTorch 2.x; dynamic loss scaling, --loss-scale)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  // DeepSpeed's "fp16" block, key for key (Note [Loss scaling]).
  auto& ls = s.loss_scale;
  g->add_option("--loss-scale", ls.loss_scale,
                "fp16: 0 scales the loss dynamically; a value > 0 is a static scale")
      ->capture_default_str();
  g->add_option("--initial-scale-power", ls.initial_scale_power,
                "fp16: the dynamic loss scale starts at 2^this")
      ->capture_default_str();
  g->add_option("--loss-scale-window", ls.loss_scale_window,
                "fp16: steps without overflow before the dynamic loss scale doubles")
      ->capture_default_str();
  g->add_option("--hysteresis", ls.hysteresis,
                "fp16: overflows absorbed (steps skipped) before the dynamic loss scale halves")
      ->capture_default_str();
  g->add_flag("--consecutive-hysteresis", ls.consecutive_hysteresis,
              "fp16: every step without overflow refills --hysteresis (default: only a doubling "
              "of the scale does)");
  g->add_option("--min-loss-scale", ls.min_loss_scale,
                "fp16: the dynamic loss scale never halves below this; an overflow there stops "
                "the run")
      ->capture_default_str();
  g->add_option("--reduce-dtype", s.reduce_dtype, "gradient reduction dtype: fp32 | bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  g->add_option("--optimizer", s.optimizer, "sgd (with --momentum) | adam | adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  g->add_option("--lr", s.lr, "learning rate (a schedule's peak)")->capture_default_str();
  g->add_option("--momentum", s.momentum, "sgd momentum")->capture_default_str();
  g->add_option_function<double>(
      "--weight-decay", [&s](double wd) { s.weight_decay = wd; },
      "weight decay (default: 0.01 for adamw, 0 for sgd and adam)");
  g->add_option("--betas", s.betas, "adam and adamw: beta1,beta2")
      ->delimiter(',')
      ->expected(2)
      ->capture_default_str();
  g->add_option("--eps", s.eps, "adam and adamw: added to the denominator")->capture_default_str();
  g->add_option("--bucket-cap-mb", s.ddp.bucket_cap_mb,
                "gradient bucket size (ddp), unit size (zero1, zero2)")
      ->capture_default_str();
  g->add_option("--min-unit-params", s.min_unit_params,
                "zero3 wrap policy: merge consecutive blocks into units of at least this many "
                "parameters (0: one unit per block)")
      ->capture_default_str();
  g->add_flag("--reshard-root-after-forward", s.reshard_root_after_forward,
              "zero3: release the parameters outside blocks (embeddings, head) when forward ends "
              "and gather them again for backward: the ZeRO paper's 3x parameter bytes (default: "
              "keep them from forward to the end of their backward, as FSDP keeps its root)");
  g->add_flag("--find-unused-parameters", s.ddp.find_unused_parameters,
              "ddp: allow parameters without gradient in a step");
  g->add_option_function<std::string>(
       "--grad-compression",
       [&s](const std::string& v) {
         s.ddp.compression = v == "fp16"   ? ddp::Compression::FP16
                             : v == "bf16" ? ddp::Compression::BF16
                                           : ddp::Compression::None;
       },
       "ddp: none | fp16 | bf16")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}))
      ->default_str("none");
}

}  // namespace dtorch::tools
