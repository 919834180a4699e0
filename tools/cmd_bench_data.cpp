// `dtorch bench data`: how many images per second the training loader decodes, transforms and
// batches, alone (no model), in the order and with the augmentation a training epoch uses.
// bench/bench_data.py runs it beside torchvision's ImageFolder + DataLoader on one folder.
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/data/prefetch.h"
#include "dtorch/data/sampler.h"
#include "dtorch/train/train_data.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct BenchDataFlags {
  std::string data;
  train::LoaderConfig loader;
  int64_t batch_size = 64;
  int64_t batches = 0;  ///< 0: one epoch
  int64_t warmup = 2;
  uint64_t seed = 1;
  int threads = 1;
};

int bench_data(const BenchDataFlags& f) {
  DTORCH_CHECK_T(ConfigError, f.batch_size >= 1 && f.batches >= 0 && f.warmup >= 0,
                 "bench data: --batch-size must be >= 1, --batches and --warmup >= 0");
  train::validate_data(f.data, f.loader, false);
  torch::set_num_threads(f.threads);
  train::DataConfig data;
  data.source = f.data;
  data.loader = f.loader;
  train::TrainData d = train::open_data(data, f.seed);
  data::DistributedSampler sampler(d.train.size, 0, 1, f.seed);
  auto batches = data::make_batches(sampler.indices(), f.batch_size, /*drop_last=*/true);
  const int64_t timed = f.batches > 0 ? std::min<int64_t>(f.batches, batches.size() - f.warmup)
                                      : static_cast<int64_t>(batches.size()) - f.warmup;
  DTORCH_CHECK_T(ConfigError, timed >= 1, "bench data: ", d.describe, " has ", batches.size(),
                 " batches of ", f.batch_size, ", too few for ", f.warmup,
                 " warm-up batch(es) and one timed; lower --batch-size or --warmup");
  data::Prefetcher loader(f.warmup + timed, f.loader.workers,
                          [&](int64_t k) { return d.train.batch(batches[k], 0); });
  log::info("bench data: ", d.describe, ", ", f.loader.workers, " worker(s), ", timed,
            " timed batch(es) of ", f.batch_size);
  for (int64_t k = 0; k < f.warmup; ++k)
    loader.next();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t images = 0;
  double checksum = 0;  // touches every batch, so none is optimised away
  for (int64_t k = 0; k < timed; ++k) {
    auto [x, y] = loader.next();
    images += x.size(0);
    checksum += x[0][0][0][0].item<double>();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json line = {{"bench", "data"},
                         {"impl", "dtorch"},
                         {"data", f.data},
                         {"workers", f.loader.workers},
                         {"batch_size", f.batch_size},
                         {"image_size", d.input.size},
                         {"images", images},
                         {"seconds", seconds},
                         {"images_per_s", static_cast<double>(images) / seconds},
                         {"checksum", checksum}};
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace

void add_bench_data_command(CLI::App& bench, int& exit_code) {
  auto f = std::make_shared<BenchDataFlags>();
  auto* cmd = bench.add_subcommand(
      "data", "Images per second the training loader decodes and batches (no model)");
  cmd->add_option("--data", f->data, "cifar10:DIR or imagefolder:DIR")->required();
  add_loader_options(cmd, f->loader);
  cmd->add_option("--batch-size", f->batch_size)->capture_default_str();
  cmd->add_option("--batches", f->batches, "timed batches (0: the rest of one epoch)")
      ->capture_default_str();
  cmd->add_option("--warmup", f->warmup, "untimed batches first")->capture_default_str();
  cmd->add_option("--seed", f->seed, "data order and augmentation")->capture_default_str();
  cmd->add_option("--threads", f->threads, "intra-op threads of the training thread")
      ->capture_default_str();
  cmd->callback([f, &exit_code] { exit_code = bench_data(*f); });
}

}  // namespace dtorch::tools
