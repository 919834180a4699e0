// Pipeline schedules as data: a pure function from (stages, micro-batches) to each rank's list
// of actions, and a simulator that runs any such lists on paper, so that a schedule's ordering,
// bubble and activation memory are tested without processes (Note [Schedules as data]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtorch::pp {

enum class ActionKind {
  Forward,         ///< run the stage's forward on a micro-batch, keep its activations
  Backward,        ///< input and weight gradients together, then free the activations
  SendActivation,  ///< the forward's output to the next stage
  RecvActivation,  ///< the previous stage's output, before Forward
  SendGrad,        ///< the input gradient to the previous stage
  RecvGrad,        ///< the next stage's input gradient, before Backward
};

struct Action {
  ActionKind kind;
  int microbatch;
  int stage;
  bool operator==(const Action& o) const {
    return kind == o.kind && microbatch == o.microbatch && stage == o.stage;
  }
};

/// "F3@1" (forward of micro-batch 3 on stage 1), "B3@1", "sA3@1", "rA3@1", "sG3@1", "rG3@1".
std::string to_string(const Action& a);

/// Note [Schedules as data]: a schedule is one list of actions per rank (rank r runs stage r),
/// compute in the order the schedule chooses and communication inserted next to it: a stage
/// receives before the compute that needs the message and sends right after the compute that
/// makes it. Every executor runs the lists as they are; the simulator checks them first.
using Schedule = std::vector<std::vector<Action>>;

/// GPipe: every forward, then every backward (Huang et al. 2019). Holds m micro-batches of
/// activations per stage.
Schedule gpipe(int stages, int microbatches);
/// 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs stages - s - 1 warm-up forwards,
/// then alternates one forward and one backward; holds at most stages - s micro-batches.
Schedule one_f_one_b(int stages, int microbatches);

/// Inserts the sends and receives next to a per-rank order of Forward/Backward actions.
Schedule with_communication(const std::vector<std::vector<Action>>& compute, int stages);

/// What running a schedule on paper gives, with forward taking `forward_time` and backward
/// `backward_time` units, messages instantaneous and sends never blocking.
struct Simulation {
  /// Time at which every rank has finished.
  double makespan = 0;
  /// Per rank: time idle before its last action ends, over makespan (the bubble).
  std::vector<double> idle_fraction;
  /// Per rank: the most micro-batches whose activations it held at once.
  std::vector<int> peak_activations;
  /// Per rank, per action: when it started.
  std::vector<std::vector<double>> start;
  double forward_time = 1, backward_time = 2;
};

/// Runs `schedule`; throws ConfigError naming the ranks and actions when it deadlocks (a
/// receive whose send never comes, or comes after the receiver waits on the sender), when a
/// receive meets a different message than it expects (order mismatch), or when a stage's
/// computation is missing or repeated.
Simulation simulate(const Schedule& schedule, int microbatches, double forward_time = 1.0,
                    double backward_time = 2.0);

/// The timeline as text, one row per rank, one column per time unit: "F3" forward of
/// micro-batch 3, "B3" backward, ". " idle.
std::string timeline(const Schedule& schedule, const Simulation& sim);

}  // namespace dtorch::pp
