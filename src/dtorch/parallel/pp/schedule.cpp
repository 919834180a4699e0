// Schedule generators and the on-paper simulator of Note [Schedules as data].
#include "dtorch/parallel/pp/schedule.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "dtorch/core/error.h"

namespace dtorch::pp {
namespace {

void check_shape(int ranks, int microbatches) {
  DTORCH_CHECK_T(ConfigError, ranks >= 1 && microbatches >= 1, "a pipeline schedule needs at ",
                 "least one stage and one micro-batch (got ", ranks, " stages, ", microbatches,
                 " micro-batches)");
}

Action forward(int m, int s) {
  return {ActionKind::Forward, m, s};
}
Action backward(int m, int s) {
  return {ActionKind::Backward, m, s};
}

/// 1F1B's compute order on one rank: warm-up forwards, then one forward and one backward
/// alternating, then the remaining backwards.
std::vector<Action> one_f_one_b_order(int ranks, int microbatches, int rank) {
  std::vector<Action> order;
  const int warmup = std::min(ranks - rank - 1, microbatches);
  for (int m = 0; m < warmup; ++m)
    order.push_back(forward(m, rank));
  for (int i = 0; i < microbatches - warmup; ++i) {
    order.push_back(forward(warmup + i, rank));
    order.push_back(backward(i, rank));
  }
  for (int m = microbatches - warmup; m < microbatches; ++m)
    order.push_back(backward(m, rank));
  return order;
}

char stage_letter(int stage, int ranks) {
  return static_cast<char>('a' + stage / ranks);
}

}  // namespace

bool is_compute(ActionKind k) {
  return k == ActionKind::Forward || k == ActionKind::Backward || k == ActionKind::BackwardInput ||
         k == ActionKind::BackwardWeight;
}

double Costs::cost(ActionKind k) const {
  switch (k) {
    case ActionKind::Forward:
      return forward;
    case ActionKind::Backward:
      return backward_input + backward_weight;
    case ActionKind::BackwardInput:
      return backward_input;
    case ActionKind::BackwardWeight:
      return backward_weight;
    default:
      return 0;
  }
}

std::string to_string(const Action& a) {
  static const char* names[] = {"F", "B", "I", "W", "sA", "rA", "sG", "rG"};
  return str(names[static_cast<int>(a.kind)], a.microbatch, "@", a.stage);
}

Schedule with_communication(const std::vector<std::vector<Action>>& compute, int stages) {
  const int ranks = static_cast<int>(compute.size());
  Schedule out(compute.size());
  for (int r = 0; r < ranks; ++r) {
    for (const Action& a : compute[r]) {
      const int s = a.stage;
      DTORCH_CHECK(rank_of_stage(s, ranks) == r, "stage ", s, " scheduled on rank ", r);
      if (a.kind == ActionKind::Forward) {
        if (s > 0) out[r].push_back({ActionKind::RecvActivation, a.microbatch, s});
        out[r].push_back(a);
        if (s < stages - 1) out[r].push_back({ActionKind::SendActivation, a.microbatch, s});
      } else if (a.kind == ActionKind::BackwardWeight) {
        out[r].push_back(a);
      } else {
        if (s < stages - 1) out[r].push_back({ActionKind::RecvGrad, a.microbatch, s});
        out[r].push_back(a);
        if (s > 0) out[r].push_back({ActionKind::SendGrad, a.microbatch, s});
      }
    }
  }
  return out;
}

Schedule gpipe(int ranks, int microbatches) {
  check_shape(ranks, microbatches);
  std::vector<std::vector<Action>> compute(ranks);
  for (int s = 0; s < ranks; ++s) {
    for (int m = 0; m < microbatches; ++m)
      compute[s].push_back(forward(m, s));
    for (int m = 0; m < microbatches; ++m)
      compute[s].push_back(backward(m, s));
  }
  return with_communication(compute, ranks);
}

Schedule one_f_one_b(int ranks, int microbatches) {
  check_shape(ranks, microbatches);
  std::vector<std::vector<Action>> compute(ranks);
  for (int r = 0; r < ranks; ++r)
    compute[r] = one_f_one_b_order(ranks, microbatches, r);
  return with_communication(compute, ranks);
}

Schedule interleaved_one_f_one_b(int ranks, int microbatches, int v) {
  check_shape(ranks, microbatches);
  DTORCH_CHECK_T(ConfigError, v >= 1, "interleaved 1F1B needs at least one stage per rank");
  DTORCH_CHECK_T(ConfigError, ranks >= 2, "interleaved 1F1B needs at least 2 pipeline ranks ",
                 "(got 1): use --schedule 1f1b");
  DTORCH_CHECK_T(ConfigError, microbatches % ranks == 0, "interleaved 1F1B sends micro-batches ",
                 "through the stages in groups of the pipeline size: --microbatches ", microbatches,
                 " must be a multiple of ", ranks);
  const int total = microbatches * v, group = ranks * v;
  // Megatron-LM's order: the k-th forward of a rank is micro-batch (k / group) * ranks +
  // k % ranks on its stage (k % group) / ranks; backwards walk the stages in reverse.
  auto microbatch = [&](int k) { return (k / group) * ranks + k % ranks; };
  std::vector<std::vector<Action>> compute(ranks);
  for (int r = 0; r < ranks; ++r) {
    auto f = [&](int k) { return forward(microbatch(k), ((k % group) / ranks) * ranks + r); };
    auto b = [&](int k) {
      return backward(microbatch(k), (v - 1 - (k % group) / ranks) * ranks + r);
    };
    const int warmup = std::min(total, (ranks - r - 1) * 2 + (v - 1) * ranks);
    for (int k = 0; k < warmup; ++k)
      compute[r].push_back(f(k));
    for (int i = 0; i < total - warmup; ++i) {
      compute[r].push_back(f(warmup + i));
      compute[r].push_back(b(i));
    }
    for (int k = total - warmup; k < total; ++k)
      compute[r].push_back(b(k));
  }
  return with_communication(compute, ranks * v);
}

Schedule zero_bubble_h1(int ranks, int microbatches) {
  check_shape(ranks, microbatches);
  std::vector<std::vector<Action>> compute(ranks);
  for (int r = 0; r < ranks; ++r) {
    int weights_done = 0;
    for (Action a : one_f_one_b_order(ranks, microbatches, r)) {
      if (a.kind == ActionKind::Forward) {
        compute[r].push_back(a);
        continue;
      }
      compute[r].push_back({ActionKind::BackwardInput, a.microbatch, r});
      // W of micro-batch i waits until B of i + r: rank r's cool-down has r gaps to fill.
      if (a.microbatch - r >= 0) {
        compute[r].push_back({ActionKind::BackwardWeight, a.microbatch - r, r});
        ++weights_done;
      }
    }
    for (int m = weights_done; m < microbatches; ++m)
      compute[r].push_back({ActionKind::BackwardWeight, m, r});
  }
  return with_communication(compute, ranks);
}

const NameTable<ScheduleKind>& names(ScheduleKind) {
  static const NameTable<ScheduleKind> n{{ScheduleKind::GPipe, "gpipe"},
                                         {ScheduleKind::OneFOneB, "1f1b"},
                                         {ScheduleKind::Interleaved, "interleaved"},
                                         {ScheduleKind::ZeroBubble, "zb"}};
  return n;
}

int default_virtual_stages(ScheduleKind kind) {
  return kind == ScheduleKind::Interleaved ? 2 : 1;
}

Schedule make_schedule(ScheduleKind kind, int ranks, int microbatches, int v) {
  if (kind == ScheduleKind::Interleaved) return interleaved_one_f_one_b(ranks, microbatches, v);
  DTORCH_CHECK_T(ConfigError, v == 1, "schedule ", name_of(kind), " runs one stage per rank (got ",
                 v, " virtual stages): use --schedule interleaved for more");
  switch (kind) {
    case ScheduleKind::GPipe:
      return gpipe(ranks, microbatches);
    case ScheduleKind::OneFOneB:
      return one_f_one_b(ranks, microbatches);
    default:
      return zero_bubble_h1(ranks, microbatches);
  }
}

Simulation simulate(const Schedule& schedule, int microbatches, Costs costs) {
  const int n = static_cast<int>(schedule.size());
  int stages = 0;
  for (const auto& actions : schedule)
    for (const Action& a : actions)
      stages = std::max(stages, a.stage + 1);
  // Each directed channel (from, to, activation or gradient) delivers in the order sent.
  struct Message {
    int stage, microbatch;
    double time;
  };
  std::map<std::tuple<int, int, bool>, std::deque<Message>> channels;
  std::vector<size_t> next(n, 0);
  std::vector<double> clock(n, 0), busy(n, 0);
  std::vector<int> live(n, 0), awaiting(n, 0);
  std::map<std::tuple<int, int, ActionKind>, int> done;  // (stage, microbatch, kind) -> count
  Simulation sim;
  sim.costs = costs;
  sim.stages = stages;
  sim.peak_activations.assign(n, 0);
  sim.peak_awaiting_weights.assign(n, 0);
  sim.start.resize(n);
  for (int r = 0; r < n; ++r)
    sim.start[r].assign(schedule[r].size(), 0);
  auto count = [&](int s, int m, ActionKind k) {
    auto it = done.find({s, m, k});
    return it == done.end() ? 0 : it->second;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < n; ++r) {
      while (next[r] < schedule[r].size()) {
        const Action& a = schedule[r][next[r]];
        const bool activation =
            a.kind == ActionKind::SendActivation || a.kind == ActionKind::RecvActivation;
        if (a.kind == ActionKind::RecvActivation || a.kind == ActionKind::RecvGrad) {
          const int peer_stage = activation ? a.stage - 1 : a.stage + 1;
          const int from = rank_of_stage(peer_stage, n);
          auto& q = channels[{from, r, activation}];
          if (q.empty()) break;  // blocked until the sender gets there
          DTORCH_CHECK_T(ConfigError,
                         q.front().microbatch == a.microbatch && q.front().stage == peer_stage,
                         "pipeline schedule: rank ", r, "'s ", to_string(a), " meets micro-batch ",
                         q.front().microbatch, " of stage ", q.front().stage, " from rank ", from,
                         ": sends and receives are in different orders");
          clock[r] = std::max(clock[r], q.front().time);
          q.pop_front();
        } else if (a.kind == ActionKind::SendActivation || a.kind == ActionKind::SendGrad) {
          const int to_stage = activation ? a.stage + 1 : a.stage - 1;
          DTORCH_CHECK_T(ConfigError, to_stage >= 0 && to_stage < stages,
                         "pipeline schedule: rank ", r, "'s ", to_string(a),
                         " has no stage to go to");
          channels[{r, rank_of_stage(to_stage, n), activation}].push_back(
              {a.stage, a.microbatch, clock[r]});
        } else {
          const double t = costs.cost(a.kind);
          sim.start[r][next[r]] = clock[r];
          clock[r] += t;
          busy[r] += t;
          if (a.kind == ActionKind::Forward) ++live[r];
          if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight) --live[r];
          if (a.kind == ActionKind::BackwardInput) ++awaiting[r];
          if (a.kind == ActionKind::BackwardWeight) --awaiting[r];
          const bool after_forward = count(a.stage, a.microbatch, ActionKind::Forward) > 0;
          const bool after_input = a.kind != ActionKind::BackwardWeight ||
                                   count(a.stage, a.microbatch, ActionKind::BackwardInput) > 0;
          DTORCH_CHECK_T(ConfigError,
                         a.kind == ActionKind::Forward || (after_forward && after_input),
                         "pipeline schedule: rank ", r, " runs ", to_string(a), " before ",
                         after_forward ? "its input gradient" : "that micro-batch's forward");
          sim.peak_activations[r] = std::max(sim.peak_activations[r], live[r]);
          sim.peak_awaiting_weights[r] = std::max(sim.peak_awaiting_weights[r], awaiting[r]);
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
  for (int s = 0; s < stages; ++s) {
    for (int m = 0; m < microbatches; ++m) {
      const bool split =
          count(s, m, ActionKind::BackwardInput) + count(s, m, ActionKind::BackwardWeight) > 0;
      std::vector<ActionKind> kinds = {ActionKind::Forward};
      if (split) {
        kinds.push_back(ActionKind::BackwardInput);
        kinds.push_back(ActionKind::BackwardWeight);
      } else {
        kinds.push_back(ActionKind::Backward);
      }
      for (ActionKind k : kinds) {
        DTORCH_CHECK_T(ConfigError, count(s, m, k) == 1, "pipeline schedule: stage ", s, " runs ",
                       to_string({k, m, s}), " ", count(s, m, k), " times; it must run once");
      }
      DTORCH_CHECK_T(ConfigError, !split || count(s, m, ActionKind::Backward) == 0,
                     "pipeline schedule: stage ", s, " runs micro-batch ", m,
                     "'s backward both whole and split");
    }
  }
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  for (int r = 0; r < n; ++r)
    sim.idle_fraction.push_back(sim.makespan > 0 ? 1.0 - busy[r] / sim.makespan : 0.0);
  return sim;
}

namespace {

/// "F3", "I3", or "F3b" for a rank's second stage when ranks run several.
std::string label(const Action& a, int ranks, int stages) {
  static const char* names[] = {"F", "B", "I", "W"};
  std::string s = str(names[static_cast<int>(a.kind)], a.microbatch);
  if (stages > ranks) s += stage_letter(a.stage, ranks);
  return s;
}

}  // namespace

std::string timeline(const Schedule& schedule, const Simulation& sim) {
  std::ostringstream os;
  const int ranks = static_cast<int>(schedule.size());
  const int columns = static_cast<int>(std::ceil(sim.makespan));
  const size_t width = sim.stages > ranks ? 4 : 3;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> cells(columns, std::string(".") + std::string(width - 1, ' '));
    for (size_t i = 0; i < schedule[r].size(); ++i) {
      const Action& a = schedule[r][i];
      if (!is_compute(a.kind)) continue;
      std::string cell = label(a, ranks, sim.stages);
      cell.resize(width, ' ');
      const double begin = sim.start[r][i];
      const double end = begin + sim.costs.cost(a.kind);
      for (int t = static_cast<int>(std::floor(begin)); t < std::min<double>(columns, end); ++t)
        cells[t] = cell;
    }
    os << "rank " << r << " |";
    for (const auto& c : cells)
      os << c;
    os << "|\n";
  }
  return os.str();
}

Picture timeline_picture(const Schedule& schedule, const Simulation& sim,
                         const std::string& title) {
  const int ranks = static_cast<int>(schedule.size());
  const double unit = 28, row = 30, left = 70, top = 40;
  const std::string legend =
      "F forward, B backward, I input gradient, W weight gradient; grey: idle";
  const double width =
      std::max(left + sim.makespan * unit + 20,
               left + Picture::text_width(std::max(legend.size(), title.size()), 14) + 20);
  Picture p(static_cast<int>(std::ceil(width)), static_cast<int>(top + ranks * row + 30));
  const Color ink{51, 51, 51};
  static const char* fills[] = {"#6baed6", "#74c476", "#a1d99b", "#fdae6b"};
  p.text(left, 22, title, 14);
  for (int r = 0; r < ranks; ++r) {
    const double y = top + r * row;
    p.text(8, y + row / 2 + 4, str("rank ", r));
    p.box(left, y, sim.makespan * unit, row - 4, Color::hex("#eeeeee"));
    for (size_t i = 0; i < schedule[r].size(); ++i) {
      const Action& a = schedule[r][i];
      if (!is_compute(a.kind)) continue;
      const double x = left + sim.start[r][i] * unit, w = sim.costs.cost(a.kind) * unit;
      p.box(x, y, w - 1, row - 4, Color::hex(fills[static_cast<int>(a.kind)]), ink);
      p.text(x + 3, y + row / 2 + 2, label(a, ranks, sim.stages));
    }
  }
  p.text(left, top + ranks * row + 18, legend);
  return p;
}

}  // namespace dtorch::pp
