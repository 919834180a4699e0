// Trainer: load data, build and wrap the model, then per epoch train, evaluate, record and
// checkpoint. All ranks take the same number of steps (the sampler pads) so DDP never waits
// on a rank that ran out of data.
#include "dtorch/train/trainer.h"

#include <filesystem>

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/data/mnist_dataset.h"
#include "dtorch/data/sampler.h"
#include "dtorch/models/registry.h"
#include "dtorch/train/checkpoint.h"
#include "dtorch/train/state_dict.h"
#include "dtorch/train/zero_grad.h"

namespace dtorch::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& c,
                                                        torch::nn::Module& m) {
  if (c.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(m.parameters(),
                                               torch::optim::SGDOptions(c.lr).momentum(c.momentum));
  }
  double wd = c.weight_decay > 0 ? c.weight_decay : 0.01;
  return std::make_unique<torch::optim::AdamW>(m.parameters(),
                                               torch::optim::AdamWOptions(c.lr).weight_decay(wd));
}

std::string config_json(const TrainConfig& c, int world) {
  return str("{\"model\":\"", c.model, "\",\"data\":\"", c.data, "\",\"batch_size\":", c.batch_size,
             ",\"lr\":", c.lr, ",\"optimizer\":\"", c.optimizer, "\",\"seed\":", c.seed,
             ",\"world_size\":", world, "}");
}

// Sum of loss and correct predictions over this rank's disjoint part of the test split,
// added up across ranks: every test sample counts exactly once.
std::pair<double, double> evaluate(models::Model& model, const data::MnistSplit& test,
                                   int64_t limit, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  model.eval();
  int64_t n = limit > 0 ? std::min(limit, test.size()) : test.size();
  auto shard = data::eval_shard(n, comm.rank(), comm.size());
  auto sums = torch::zeros({3}, torch::kDouble);  // loss, correct, count
  for (int64_t b = shard.begin; b < shard.end; b += 1000) {
    int64_t e = std::min(shard.end, b + 1000);
    auto x = test.images.slice(0, b, e);
    auto y = test.labels.slice(0, b, e);
    auto logits = model.forward(x);
    sums[0] += torch::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    sums[1] += logits.argmax(1).eq(y).sum().item<double>();
    sums[2] += static_cast<double>(e - b);
  }
  comm.allreduce(sums, comm::ReduceOp::Sum, "evaluation totals");
  model.train();
  double count = sums[2].item<double>();
  return {sums[0].item<double>() / count, sums[1].item<double>() / count};
}

}  // namespace

void validate(const TrainConfig& c) {
  auto names = models::model_names();
  DTORCH_CHECK_T(ConfigError, std::find(names.begin(), names.end(), c.model) != names.end(),
                 "unknown model '", c.model, "'; choose one of: ", [&] {
                   std::string s;
                   for (auto& n : names)
                     s += (s.empty() ? "" : ", ") + n;
                   return s;
                 }());
  DTORCH_CHECK_T(ConfigError, c.data == "fashion-mnist" || c.data == "mnist", "unknown data '",
                 c.data, "'; use fashion-mnist or mnist (IDX files, see --data-dir)");
  DTORCH_CHECK_T(ConfigError, c.epochs >= 1, "--epochs must be >= 1 (got ", c.epochs, ")");
  DTORCH_CHECK_T(ConfigError, c.batch_size >= 1, "--batch-size must be >= 1 (got ", c.batch_size,
                 ")");
  DTORCH_CHECK_T(ConfigError, c.lr > 0, "--lr must be positive (got ", c.lr, ")");
  DTORCH_CHECK_T(ConfigError, c.optimizer == "sgd" || c.optimizer == "adamw", "unknown optimizer '",
                 c.optimizer, "'; use sgd or adamw");
  DTORCH_CHECK_T(ConfigError, c.accum_steps >= 1, "--accum-steps must be >= 1");
  DTORCH_CHECK_T(ConfigError, !c.out.empty(), "--out must name a directory");
  DTORCH_CHECK_T(ConfigError, c.keep_checkpoints >= 1, "--keep-checkpoints must be >= 1");
}

std::vector<EpochRecord> train(const TrainConfig& c, std::shared_ptr<comm::Communicator> comm) {
  validate(c);
  if (c.threads > 0) torch::set_num_threads(c.threads);
  const bool lead = comm->rank() == 0;
  const int world = comm->size();
  std::string dir = c.data_dir.empty() ? data::kDefaultMnistDir : c.data_dir;
  if (lead) {
    log::info("training ", c.model, " on ", c.data, " (", dir, "), ", world, " rank(s) x batch ",
              c.batch_size, ", ", c.epochs, " epoch(s), ", c.optimizer, " lr ", c.lr, ", seed ",
              c.seed, ", ", torch::get_num_threads(), " thread(s) per rank -> ", c.out);
  }

  torch::manual_seed(c.seed);
  auto model = models::make_model(c.model);
  auto opt = make_optimizer(c, *model);
  int64_t start_epoch = 0, global_step = 0;
  if (c.resume) {
    if (auto ck = load_latest_checkpoint(c.out, *model, opt.get())) {
      start_epoch = ck->data.epoch;
      global_step = ck->data.global_step;
      if (lead) log::info("resuming from ", ck->path, " (", start_epoch, " epoch(s) done)");
    } else if (lead) {
      log::info("--resume: no checkpoint in ", c.out, ", starting from scratch");
    }
    // Every rank must resume from the same epoch, or their steps would not match.
    auto e = torch::tensor({double(start_epoch), -double(start_epoch)}, torch::kDouble);
    comm->allreduce(e, comm::ReduceOp::Max, "resume epoch check");
    DTORCH_CHECK_T(CheckpointError, e[0].item<double>() == -e[1].item<double>(),
                   "ranks found different checkpoints in ", c.out,
                   " (is --out on a filesystem every node shares?)");
  }
  auto ddp = ddp::wrap(model, comm, c.ddp);

  auto train_set = data::load_mnist(dir, "train");
  auto test_set = data::load_mnist(dir, "test");
  int64_t n_train =
      c.train_samples > 0 ? std::min(c.train_samples, train_set.size()) : train_set.size();
  data::DistributedSampler sampler(n_train, comm->rank(), world, c.seed);
  std::unique_ptr<MetricsWriter> metrics;
  if (lead) metrics = std::make_unique<MetricsWriter>(c.out + "/metrics.jsonl", c.resume);
  ProgressReporter progress(lead ? c.progress : ProgressConfig{ProgressConfig::Mode::Off});

  std::vector<EpochRecord> records;
  for (int64_t epoch = start_epoch; epoch < c.epochs; ++epoch) {
    auto t0 = Clock::now();
    sampler.set_epoch(epoch);
    auto batches = data::make_batches(sampler.indices(), c.batch_size);
    progress.start_epoch(epoch, c.epochs, static_cast<int64_t>(batches.size()));
    model->train();
    double loss_sum = 0;
    int64_t samples = 0;
    for (size_t i = 0; i < batches.size(); ++i) {
      auto batch = data::gather(train_set, batches[i]);
      bool last_micro = (i + 1) % c.accum_steps == 0 || i + 1 == batches.size();
      auto loss = torch::cross_entropy_loss(model->forward(batch.images), batch.labels);
      {
        std::optional<ddp::DistributedDataParallel::NoSync> guard;
        if (!last_micro) guard.emplace(ddp->no_sync());
        (loss / c.accum_steps).backward();
      }
      if (last_micro) {
        opt->step();
        zero_grad_to_none(*opt);
        ++global_step;
      }
      double l = loss.item<double>();
      loss_sum += l;
      samples += batch.labels.size(0) * world;
      progress.update(static_cast<int64_t>(i) + 1, l, samples);
    }
    double train_seconds = seconds_since(t0);
    progress.finish_epoch();

    auto mean_loss =
        torch::tensor({loss_sum / std::max<size_t>(1, batches.size())}, torch::kDouble);
    comm->allreduce(mean_loss, comm::ReduceOp::Avg, "epoch train loss");
    auto [test_loss, test_acc] = evaluate(*model, test_set, c.test_samples, *comm);
    EpochRecord r{epoch,    mean_loss.item<double>(), test_loss,
                  test_acc, samples / train_seconds,  seconds_since(t0)};
    records.push_back(r);
    if (lead) {
      log::info("epoch ", epoch + 1, "/", c.epochs, ": train loss ", r.train_loss, ", test loss ",
                r.test_loss, ", test accuracy ", 100.0 * r.test_accuracy, "%, ",
                static_cast<int64_t>(r.samples_per_s), " samples/s, ", r.seconds, " s");
      metrics->write_epoch(r);
      save_checkpoint(c.out, {epoch + 1, global_step, config_json(c, world)}, *model, opt.get(),
                      c.keep_checkpoints);
    }
    comm->barrier("end of epoch");
  }
  if (lead) {
    save_state_dict(*model, c.out + "/model.pt");
    log::info("wrote ", c.out, "/model.pt (a state_dict for Python's torch.load)");
  }
  return records;
}

}  // namespace dtorch::train
