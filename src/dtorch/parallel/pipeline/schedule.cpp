// Schedule generators and the on-paper simulator of Note [Schedules as data].
#include "dtorch/parallel/pipeline/schedule.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

#include "dtorch/core/error.h"

namespace dtorch::pp {
namespace {

void check_shape(int stages, int microbatches) {
  DTORCH_CHECK_T(ConfigError, stages >= 1 && microbatches >= 1, "a pipeline schedule needs at ",
                 "least one stage and one micro-batch (got ", stages, " stages, ", microbatches,
                 " micro-batches)");
}

bool is_compute(ActionKind k) {
  return k == ActionKind::Forward || k == ActionKind::Backward;
}

}  // namespace

std::string to_string(const Action& a) {
  const char* k = "";
  switch (a.kind) {
    case ActionKind::Forward:
      k = "F";
      break;
    case ActionKind::Backward:
      k = "B";
      break;
    case ActionKind::SendActivation:
      k = "sA";
      break;
    case ActionKind::RecvActivation:
      k = "rA";
      break;
    case ActionKind::SendGrad:
      k = "sG";
      break;
    case ActionKind::RecvGrad:
      k = "rG";
      break;
  }
  return str(k, a.microbatch, "@", a.stage);
}

Schedule with_communication(const std::vector<std::vector<Action>>& compute, int stages) {
  Schedule out(compute.size());
  for (size_t s = 0; s < compute.size(); ++s) {
    const int st = static_cast<int>(s);
    for (const Action& a : compute[s]) {
      if (a.kind == ActionKind::Forward) {
        if (st > 0) out[s].push_back({ActionKind::RecvActivation, a.microbatch, st});
        out[s].push_back(a);
        if (st < stages - 1) out[s].push_back({ActionKind::SendActivation, a.microbatch, st});
      } else {
        if (st < stages - 1) out[s].push_back({ActionKind::RecvGrad, a.microbatch, st});
        out[s].push_back(a);
        if (st > 0) out[s].push_back({ActionKind::SendGrad, a.microbatch, st});
      }
    }
  }
  return out;
}

Schedule gpipe(int stages, int microbatches) {
  check_shape(stages, microbatches);
  std::vector<std::vector<Action>> compute(stages);
  for (int s = 0; s < stages; ++s) {
    for (int m = 0; m < microbatches; ++m)
      compute[s].push_back({ActionKind::Forward, m, s});
    for (int m = 0; m < microbatches; ++m)
      compute[s].push_back({ActionKind::Backward, m, s});
  }
  return with_communication(compute, stages);
}

Schedule one_f_one_b(int stages, int microbatches) {
  check_shape(stages, microbatches);
  std::vector<std::vector<Action>> compute(stages);
  for (int s = 0; s < stages; ++s) {
    const int warmup = std::min(stages - s - 1, microbatches);
    for (int m = 0; m < warmup; ++m)
      compute[s].push_back({ActionKind::Forward, m, s});
    for (int i = 0; i < microbatches - warmup; ++i) {
      compute[s].push_back({ActionKind::Forward, warmup + i, s});
      compute[s].push_back({ActionKind::Backward, i, s});
    }
    for (int m = microbatches - warmup; m < microbatches; ++m)
      compute[s].push_back({ActionKind::Backward, m, s});
  }
  return with_communication(compute, stages);
}

Simulation simulate(const Schedule& schedule, int microbatches, double forward_time,
                    double backward_time) {
  const int n = static_cast<int>(schedule.size());
  // Each directed channel (from, to, activation or gradient) delivers in the order sent.
  struct Message {
    int microbatch;
    double time;
  };
  std::map<std::tuple<int, int, bool>, std::deque<Message>> channels;
  std::vector<size_t> next(n, 0);
  std::vector<double> clock(n, 0), busy(n, 0);
  std::vector<int> live(n, 0);
  std::map<std::tuple<int, int, ActionKind>, int> done;  // (stage, microbatch, kind) -> count
  Simulation sim;
  sim.forward_time = forward_time;
  sim.backward_time = backward_time;
  sim.peak_activations.assign(n, 0);
  sim.start.resize(n);
  for (int r = 0; r < n; ++r)
    sim.start[r].assign(schedule[r].size(), 0);

  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < n; ++r) {
      while (next[r] < schedule[r].size()) {
        const Action& a = schedule[r][next[r]];
        const bool activation =
            a.kind == ActionKind::SendActivation || a.kind == ActionKind::RecvActivation;
        if (a.kind == ActionKind::RecvActivation || a.kind == ActionKind::RecvGrad) {
          const int from = activation ? r - 1 : r + 1;
          auto& q = channels[{from, r, activation}];
          if (q.empty()) break;  // blocked until the sender gets there
          DTORCH_CHECK_T(ConfigError, q.front().microbatch == a.microbatch,
                         "pipeline schedule: ", "rank ", r, "'s ", to_string(a),
                         " meets micro-batch ", q.front().microbatch, " from rank ", from,
                         ": sends and receives are in different orders");
          clock[r] = std::max(clock[r], q.front().time);
          q.pop_front();
        } else if (a.kind == ActionKind::SendActivation || a.kind == ActionKind::SendGrad) {
          const int to = activation ? r + 1 : r - 1;
          DTORCH_CHECK_T(ConfigError, to >= 0 && to < n, "pipeline schedule: rank ", r, "'s ",
                         to_string(a), " has no rank to go to");
          channels[{r, to, activation}].push_back({a.microbatch, clock[r]});
        } else {
          const double t = a.kind == ActionKind::Forward ? forward_time : backward_time;
          sim.start[r][next[r]] = clock[r];
          clock[r] += t;
          busy[r] += t;
          live[r] += a.kind == ActionKind::Forward ? 1 : -1;
          DTORCH_CHECK_T(ConfigError, live[r] >= 0, "pipeline schedule: rank ", r, " runs ",
                         to_string(a), " before that micro-batch's forward");
          sim.peak_activations[r] = std::max(sim.peak_activations[r], live[r]);
          ++done[{a.stage, a.microbatch, a.kind}];
        }
        ++next[r];
        progress = true;
      }
    }
  }
  std::ostringstream stuck;
  for (int r = 0; r < n; ++r) {
    if (next[r] < schedule[r].size())
      stuck << " rank " << r << " at " << to_string(schedule[r][next[r]]);
  }
  DTORCH_CHECK_T(ConfigError, stuck.str().empty(), "pipeline schedule deadlocks: every rank left ",
                 "waits for a message that is never sent:", stuck.str());
  for (int s = 0; s < n; ++s) {
    for (int m = 0; m < microbatches; ++m) {
      for (ActionKind k : {ActionKind::Forward, ActionKind::Backward}) {
        auto it = done.find({s, m, k});
        const int count = it == done.end() ? 0 : it->second;
        DTORCH_CHECK_T(ConfigError, count == 1, "pipeline schedule: stage ", s, " runs ",
                       to_string({k, m, s}), " ", count, " times; it must run once");
      }
    }
  }
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  for (int r = 0; r < n; ++r)
    sim.idle_fraction.push_back(sim.makespan > 0 ? 1.0 - busy[r] / sim.makespan : 0.0);
  return sim;
}

std::string timeline(const Schedule& schedule, const Simulation& sim) {
  std::ostringstream os;
  const int columns = static_cast<int>(std::ceil(sim.makespan));
  for (size_t r = 0; r < schedule.size(); ++r) {
    std::vector<std::string> cells(columns, ".  ");
    for (size_t i = 0; i < schedule[r].size(); ++i) {
      const Action& a = schedule[r][i];
      if (!is_compute(a.kind)) continue;
      std::string label = str(a.kind == ActionKind::Forward ? "F" : "B", a.microbatch);
      label.resize(3, ' ');
      const double begin = sim.start[r][i];
      const double end =
          begin + (a.kind == ActionKind::Forward ? sim.forward_time : sim.backward_time);
      for (int t = static_cast<int>(std::floor(begin)); t < std::min<double>(columns, end); ++t)
        cells[t] = label;
    }
    os << "rank " << r << " |";
    for (const auto& c : cells)
      os << c;
    os << "|\n";
  }
  return os.str();
}

}  // namespace dtorch::pp
