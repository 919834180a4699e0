// Checkpoints written on a thread of their own. See Note [Checkpoints in the background].
#include "dtorch/train/background_save.h"

#include <cstdio>
#include <numeric>
#include <vector>

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/trace_range.h"
#include "dtorch/train/step_stats.h"

namespace dtorch::train {

namespace {

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f s", s);
  return text;
}

}  // namespace

BackgroundSaver::BackgroundSaver(Strategy& strategy) : strategy_(strategy) {}

BackgroundSaver::~BackgroundSaver() {
  if (!worker_.joinable()) return;
  bool ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended = ended_;
  }
  if (!ended)
    log::warn("waiting for the checkpoint of step ", step_,
              " being written in the background to end (at most DTORCH_TIMEOUT, ",
              twin_->options().timeout.count() / 1000, " s, when a peer is gone)");
  worker_.join();
}

void BackgroundSaver::save(const std::string& dir, const checkpoint::CheckpointData& data,
                           int keep) {
  if (worker_.joinable()) {
    const auto t0 = Clock::now();
    wait_for_job();
    log::info("waited ", seconds_text(seconds_since(t0)), " for the checkpoint of step ", step_,
              " to be written before saving step ", data.global_step);
    report();
  }
  comm::Communicator& group = strategy_.save_group();
  if (!twin_) {
    std::vector<int> all(group.size());
    std::iota(all.begin(), all.end(), 0);
    twin_ = group.split(all, "checkpoint");
  }
  SaveJob job;
  {
    TraceRange range("checkpoint staging");
    job = strategy_.stage(dir, data, keep, /*background=*/true);
  }
  step_ = data.global_step;
  started_ = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = false;
    failure_ = nullptr;
  }
  worker_ = std::thread([this, job = std::move(job)] {
    std::exception_ptr failure;
    try {
      job(*twin_);
    } catch (...) {
      failure = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = failure;
    ended_ = true;
    ended_cv_.notify_all();
  });
}

void BackgroundSaver::poll() {
  if (!worker_.joinable()) return;
  torch::Tensor ended = torch::zeros({1}, torch::kLong);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended[0] = ended_ ? 1 : 0;
  }
  strategy_.save_group().allreduce(ended, comm::ReduceOp::Min,
                                   "has every rank written its part of the checkpoint?");
  if (ended.item<int64_t>() == 1) report();
}

void BackgroundSaver::finish() {
  if (!worker_.joinable()) return;
  wait_for_job();
  report();
}

void BackgroundSaver::wait_for_job() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!ended_cv_.wait_for(lock, std::chrono::seconds(10), [this] { return ended_; }))
    log::info("waiting for the checkpoint of step ", step_, " to be written in the background (",
              static_cast<int64_t>(seconds_since(started_)), " s so far)");
}

void BackgroundSaver::report() {
  worker_.join();
  std::exception_ptr failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(failure, failure_);
  }
  if (!failure) {
    log::debug("checkpoint of step ", step_, " written in the background in ",
               seconds_text(seconds_since(started_)));
    return;
  }
  try {
    std::rethrow_exception(failure);
  } catch (const CheckpointError& e) {
    DTORCH_FAIL(CheckpointError, "the checkpoint of step ", step_,
                ", written in the background, failed: ", e.what(),
                ". Training stops here; the checkpoints before it are untouched and --resume "
                "continues from the newest");
  }
}

}  // namespace dtorch::train
