// OrderedThread: runs jobs one at a time in issue order, off the caller's thread: a
// communicator's multi-step collectives (shared memory, the ring reduce-scatter) and the
// optimizer offload's reads and writes (Note [Optimizer state on disk]).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

namespace dtorch {

// Runs jobs one at a time in submission order, off the caller's thread, so a shared-memory
// allreduce started from a gradient hook overlaps with the rest of backward like Gloo's does
// (Communicator::Impl holds one), and the next shard's optimizer state is read from disk while
// this one steps.
// A finished job's captures are dropped on this thread, and they may hold the last reference
// to the communicator itself (a tensor whose autograd graph keeps a tensor-parallel region's
// group): the communicator is then destroyed here, and a thread cannot join itself. So the
// queue lives in a State the thread shares, and destroyed from its own thread an
// OrderedThread lets the thread go; it finds the stop flag and ends after that job.
class OrderedThread {
 public:
  OrderedThread() : thread_([s = state_] { loop(*s); }) {}
  ~OrderedThread() {
    {
      std::lock_guard<std::mutex> l(state_->mu);
      state_->stop = true;
    }
    state_->cv.notify_one();
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  std::shared_future<void> submit(std::function<void()> job) {
    std::packaged_task<void()> task(std::move(job));
    std::shared_future<void> f = task.get_future().share();
    {
      std::lock_guard<std::mutex> l(state_->mu);
      state_->jobs.push_back(std::move(task));
    }
    state_->cv.notify_one();
    return f;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::packaged_task<void()>> jobs;
    bool stop = false;
  };
  static void loop(State& s) {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> l(s.mu);
        s.cv.wait(l, [&s] { return s.stop || !s.jobs.empty(); });
        if (s.jobs.empty()) return;
        task = std::move(s.jobs.front());
        s.jobs.pop_front();
      }
      task();
    }
  }
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;  // after state_: it starts with a copy of it
};

}  // namespace dtorch
