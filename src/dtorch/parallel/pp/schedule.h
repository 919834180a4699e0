// Pipeline schedules as data: a pure function from (ranks, micro-batches, virtual stages) to
// each rank's list of actions, and a simulator that runs any such lists on paper, so that a
// schedule's ordering, bubble and activation memory are tested without processes (Note
// [Schedules as data]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtorch/core/enum_names.h"
#include "dtorch/core/picture.h"

namespace dtorch::pp {

enum class ActionKind {
  Forward,         ///< run the stage's forward on a micro-batch, keep its activations
  Backward,        ///< input and weight gradients together, then free the activations
  BackwardInput,   ///< the input gradient only (zero-bubble's B); activations stay for W
  BackwardWeight,  ///< the weight gradients of a micro-batch whose B ran (W), then free
  SendActivation,  ///< the forward's output to the next stage
  RecvActivation,  ///< the previous stage's output, before Forward
  SendGrad,        ///< the input gradient to the previous stage
  RecvGrad,        ///< the next stage's input gradient, before Backward / BackwardInput
};

struct Action {
  ActionKind kind;
  int microbatch;
  int stage;
  bool operator==(const Action& o) const {
    return kind == o.kind && microbatch == o.microbatch && stage == o.stage;
  }
};

/// "F3@1" (forward of micro-batch 3 on stage 1), "B3@1", "I3@1" (input gradient), "W3@1",
/// "sA3@1", "rA3@1", "sG3@1", "rG3@1".
std::string to_string(const Action& a);

bool is_compute(ActionKind k);

/// Note [Schedules as data]: a schedule is one list of actions per rank. The model is cut
/// into ranks x v stages; stage s lives on rank s % ranks (v > 1: interleaved, rank r runs
/// stages r, r + ranks, ...). Compute comes in the order the schedule chooses and
/// communication is inserted next to it: a stage receives right before the compute that
/// needs the message and sends right after the compute that makes it. Messages between two
/// ranks arrive in the order sent (one channel per direction and kind), so a schedule is
/// correct only if every rank receives in the order its peer sends; the simulator checks
/// that, and deadlock, before anything runs. Every executor runs the lists as they are.
using Schedule = std::vector<std::vector<Action>>;

/// The rank that runs `stage` when a schedule has `ranks` ranks.
inline int rank_of_stage(int stage, int ranks) {
  return stage % ranks;
}

/// GPipe: every forward, then every backward (Huang et al. 2019). Holds m micro-batches of
/// activations per stage.
Schedule gpipe(int ranks, int microbatches);
/// 1F1B (PipeDream-Flush, Narayanan et al. 2021): rank r runs ranks - r - 1 warm-up
/// forwards, then alternates one forward and one backward; holds at most ranks - r
/// micro-batches.
Schedule one_f_one_b(int ranks, int microbatches);
/// Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM): each rank runs `virtual_stages`
/// stages, micro-batches go through them in groups of `ranks`; the bubble shrinks by the
/// factor v for v times the messages. Needs ranks >= 2 and microbatches a multiple of ranks.
Schedule interleaved_one_f_one_b(int ranks, int microbatches, int virtual_stages);
/// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B's order with backward
/// split into B (input gradient, on the critical path) and W (weight gradient); rank r runs
/// W of micro-batch i right after B of micro-batch i + r, so the deferred Ws fill 1F1B's
/// cool-down bubble. With equal F, B, W times the bubble is a third of 1F1B's, and no rank
/// holds more than `ranks` micro-batches (1F1B's largest).
Schedule zero_bubble_h1(int ranks, int microbatches);

/// The schedules by name: gpipe | 1f1b | interleaved | zb (--schedule).
enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubble };
const NameTable<ScheduleKind>& names(ScheduleKind);

/// The schedule `kind`; ConfigError when virtual_stages does not fit it.
Schedule make_schedule(ScheduleKind kind, int ranks, int microbatches, int virtual_stages = 1);
/// Stages per rank `kind` uses by default (2 for interleaved, else 1).
int default_virtual_stages(ScheduleKind kind);

/// Inserts the sends and receives next to a per-rank order of compute actions, for a model
/// of `stages` stages over compute.size() ranks.
Schedule with_communication(const std::vector<std::vector<Action>>& compute, int stages);

/// Time units of each compute action; Backward takes backward_input + backward_weight.
struct Costs {
  double forward = 1, backward_input = 1, backward_weight = 1;
  double cost(ActionKind k) const;
};

/// What running a schedule on paper gives, messages instantaneous and sends never blocking.
struct Simulation {
  /// Time at which every rank has finished.
  double makespan = 0;
  /// Per rank: time idle before the makespan, over the makespan (the bubble).
  std::vector<double> idle_fraction;
  /// Per rank: the most (stage, micro-batch) activations it held at once.
  std::vector<int> peak_activations;
  /// Per rank: the most (stage, micro-batch) pairs whose input gradient ran and whose weight
  /// gradients wait (a zero-bubble schedule's I before its W) at once; each holds the gradients
  /// recorded for its weights (Note [Split backward]) beside its activations.
  std::vector<int> peak_awaiting_weights;
  /// Per rank, per action: when it started.
  std::vector<std::vector<double>> start;
  Costs costs;
  int stages = 0;
};

/// Runs `schedule`; throws ConfigError naming the ranks and actions when it deadlocks (a
/// receive whose send never comes, or comes after the receiver waits on the sender), when a
/// receive meets a different message than it expects (order mismatch), or when a stage's
/// computation is missing, repeated or out of order.
Simulation simulate(const Schedule& schedule, int microbatches, Costs costs = {});

/// The timeline as text, one row per rank, one column per time unit: "F3" forward of
/// micro-batch 3, "B3" backward, "I3"/"W3" its input / weight halves, ". " idle; with several
/// stages per rank a letter names the rank's stage ("F3a" its first, "F3b" its second).
std::string timeline(const Schedule& schedule, const Simulation& sim);
/// The same timeline as a picture (one coloured box per compute action), for write_picture.
Picture timeline_picture(const Schedule& schedule, const Simulation& sim, const std::string& title);

}  // namespace dtorch::pp
