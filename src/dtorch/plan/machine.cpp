// Machine files (machine.h): read key by key through json_config, written by calibrate.
#include "dtorch/plan/machine.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>

#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"
#include "dtorch/core/json_config.h"
#include "dtorch/core/log.h"
#include "dtorch/parallel/zero/zero.h"

namespace dtorch::plan {
namespace {

const std::vector<Collective> kCollectives = {Collective::AllReduce, Collective::ReduceScatter,
                                              Collective::AllGather, Collective::P2P};

// Each object of the list at `key` in `s`, as a section named key[i] whose `fields` are the
// only keys; false when `s` has no `key`. ConfigError naming the key when it is not a
// non-empty list.
bool for_each_entry(const json_config::Section& s, const std::string& key,
                    const json_config::Keys& fields, std::vector<std::string>* warnings,
                    const std::function<void(const json_config::Section&)>& f) {
  const nlohmann::json* list = s.get(key);
  if (!list) return false;
  std::string shape;
  for (const std::string& field : fields)
    shape += (shape.empty() ? "\"" : ", \"") + field + "\"";
  DTORCH_CHECK_T(ConfigError, list->is_array() && !list->empty(), s.file(), ": ", s.name(key),
                 " must be a list of {", shape, "} objects (got ", list->dump(), ")");
  for (size_t i = 0; i < list->size(); ++i) {
    json_config::Section e((*list)[i], s.name(key) + "[" + std::to_string(i) + "]", s.file(),
                           warnings);
    e.keys(fields, {});
    f(e);
  }
  return true;
}

// Rates a machine can have: from 1000 a second (below it a prediction is days a step, and a
// rate of 1e-300 would make it inf) to 1e18 FLOP/s and 10 TB/s.
constexpr double kMinRate = 1e3, kMaxFlops = 1e18, kMaxBytesPerSecond = 1e13;

std::map<Collective, std::vector<LinkCost>> read_links(const json_config::Section& s,
                                                       std::vector<std::string>* warnings) {
  json_config::Keys names;
  for (Collective c : kCollectives)
    names.push_back(collective_name(c));
  s.keys(names, {});
  std::map<Collective, std::vector<LinkCost>> out;
  for (Collective c : kCollectives) {
    const bool listed = for_each_entry(
        s, collective_name(c), {"ranks", "latency_s", "bus_bytes_per_s"}, warnings,
        [&](const json_config::Section& e) {
          LinkCost l;
          l.ranks = static_cast<int>(e.integer("ranks", 2, 1 << 20).value_or(0));
          DTORCH_CHECK_T(ConfigError, l.ranks >= 2 && e.has("bus_bytes_per_s"), s.file(), ": ",
                         e.name("ranks"), " and ", e.name("bus_bytes_per_s"),
                         " are needed: give the group size and its measured bus bandwidth");
          l.latency_s = e.number("latency_s", 0, 10).value_or(0);
          l.bus_bytes_per_s = *e.number("bus_bytes_per_s", kMinRate, kMaxBytesPerSecond);
          out[c].push_back(l);
        });
    if (!listed) continue;
    std::sort(out[c].begin(), out[c].end(),
              [](const LinkCost& a, const LinkCost& b) { return a.ranks < b.ranks; });
  }
  return out;
}

// The dtypes `rates` has, comma-separated ("none" for none): what an error says a file has.
std::string dtypes_of(const std::map<std::string, double>& rates) {
  std::string known;
  for (const auto& kv : rates)
    known += (known.empty() ? "" : ", ") + kv.first;
  return known.empty() ? "none" : known;
}

nlohmann::json links_json(const std::map<Collective, std::vector<LinkCost>>& links) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [op, costs] : links) {
    nlohmann::json list = nlohmann::json::array();
    for (const LinkCost& l : costs)
      list.push_back(
          {{"ranks", l.ranks}, {"latency_s", l.latency_s}, {"bus_bytes_per_s", l.bus_bytes_per_s}});
    j[collective_name(op)] = list;
  }
  return j;
}

}  // namespace

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce:
      return "allreduce";
    case Collective::ReduceScatter:
      return "reduce_scatter";
    case Collective::AllGather:
      return "allgather";
    case Collective::P2P:
      return "p2p";
  }
  return "?";
}

double ring_steps(Collective op, int n) {
  if (op == Collective::P2P) return 1;
  return op == Collective::AllReduce ? 2.0 * (n - 1) : n - 1.0;
}

double bus_bytes(Collective op, int n, double bytes) {
  if (op == Collective::P2P) return bytes;
  const double share = double(n - 1) / n;
  return op == Collective::AllReduce ? 2 * share * bytes : share * bytes;
}

namespace {

// `op` over `ranks` ranks on `bytes` at the measurement of the largest group no larger than this
// one (the smallest if all are larger).
double over_links(const std::vector<LinkCost>& costs, Collective op, int ranks, double bytes) {
  const LinkCost* use = &costs.front();
  for (const LinkCost& l : costs)
    if (l.ranks <= ranks) use = &l;
  return use->latency_s * ring_steps(op, ranks) +
         bus_bytes(op, ranks, bytes) / use->bus_bytes_per_s;
}

}  // namespace

double Machine::seconds(Collective op, int ranks, double bytes, bool across_nodes) const {
  if (ranks <= 1 || bytes <= 0) return 0;
  const auto& links = across_nodes ? inter_node : intra_node;
  auto it = links.find(op);
  DTORCH_CHECK_T(ConfigError, it != links.end() && !it->second.empty(), "machine '", name,
                 "' has no ", across_nodes ? "inter_node" : "intra_node", ".", collective_name(op),
                 " measurement, which a plan ", across_nodes ? "across nodes" : "",
                 " needs: calibrate it with dtorch plan "
                 "calibrate",
                 across_nodes ? " on 2 or more nodes" : "", ", or add it to the machine file");
  return over_links(it->second, op, ranks, bytes);
}

double Machine::concurrent_seconds(Collective op, int ranks, double bytes) const {
  auto it = inter_node_concurrent.find(op);
  if (it == inter_node_concurrent.end() || it->second.empty())
    return seconds(op, ranks, bytes, true);
  return ranks <= 1 || bytes <= 0 ? 0 : over_links(it->second, op, ranks, bytes);
}

double Machine::flops(const std::string& dtype, double rows) const {
  auto by_rows = matmul_by_rows.find(dtype);
  if (rows > 0 && by_rows != matmul_by_rows.end() && !by_rows->second.empty()) {
    const std::vector<RowsRate>& r = by_rows->second;
    if (rows <= r.front().rows) return r.front().flops;
    if (rows >= r.back().rows) return r.back().flops;
    size_t i = 1;
    while (double(r[i].rows) < rows)
      ++i;
    const double x = std::log(rows / r[i - 1].rows) / std::log(double(r[i].rows) / r[i - 1].rows);
    return r[i - 1].flops + x * (r[i].flops - r[i - 1].flops);
  }
  auto it = matmul_flops.find(dtype);
  if (it != matmul_flops.end()) return it->second;
  DTORCH_FAIL(ConfigError, "machine '", name, "' has no matmul rate for ", dtype, " (it has ",
              dtypes_of(matmul_flops), "): calibrate it, or add matmul_flops.", dtype,
              " to the machine file");
}

double Machine::convolution_flops(const std::string& dtype) const {
  auto it = conv_flops.find(dtype);
  if (it != conv_flops.end()) return it->second;
  DTORCH_FAIL(ConfigError, "machine '", name, "' has no convolution rate for ", dtype, " (it has ",
              dtypes_of(conv_flops),
              "): calibrate it again (dtorch plan calibrate measures one), or add conv_flops.",
              dtype, " to the machine file");
}

Machine read_machine(const std::string& path) {
  const std::string text = read_input_file<ConfigError>(path, "--machine");
  const nlohmann::json j = json_config::parse(text, path);
  std::vector<std::string> warnings;
  json_config::Section s(j, "", path, &warnings);
  s.keys({"name", "device", "ranks_per_node", "memory_per_rank_bytes", "base_bytes_per_rank",
          "matmul_flops", "matmul_by_rows", "conv_flops", "first_touch_seconds_per_byte",
          "adamw_seconds_per_parameter", "ring_attention", "lockstep_fraction", "offload_disk",
          "intra_node", "inter_node", "inter_node_concurrent", "overlap"},
         {});
  Machine m;
  m.name = s.text("name").value_or(path);
  m.device = s.choice("device", {"cpu", "cuda"}).value_or("cpu");
  m.ranks_per_node = static_cast<int>(s.integer("ranks_per_node", 1, 1 << 16).value_or(1));
  auto needed = [&](const char* key) {
    DTORCH_CHECK_T(ConfigError, s.has(key), path, ": ", key,
                   " is missing: dtorch plan calibrate writes it, or add it by hand");
  };
  needed("memory_per_rank_bytes");
  m.memory_per_rank_bytes = *s.number("memory_per_rank_bytes", 1 << 20, 1e16);
  m.base_bytes_per_rank = s.number("base_bytes_per_rank", 0, 1e16).value_or(0);
  // A rate per dtype (fp32, bf16) of `rates`.
  auto read_rates = [&](const json_config::Section& rates, std::map<std::string, double>& into) {
    rates.keys({"fp32", "bf16"}, {});
    for (const char* dtype : {"fp32", "bf16"})
      if (auto r = rates.number(dtype, kMinRate, kMaxFlops)) into[dtype] = *r;
  };
  needed("matmul_flops");
  read_rates(*s.section("matmul_flops"), m.matmul_flops);
  if (auto conv = s.section("conv_flops")) read_rates(*conv, m.conv_flops);
  if (auto by_rows = s.section("matmul_by_rows")) {
    by_rows->keys({"fp32", "bf16"}, {});
    for (const char* dtype : {"fp32", "bf16"}) {
      const bool listed = for_each_entry(
          *by_rows, dtype, {"rows", "flops"}, &warnings, [&](const json_config::Section& e) {
            DTORCH_CHECK_T(ConfigError, e.has("rows") && e.has("flops"), path, ": ", e.name("rows"),
                           " and ", e.name("flops"),
                           " are needed: give the rows measured and the rate at them");
            m.matmul_by_rows[dtype].push_back(
                {*e.integer("rows", 1, int64_t(1) << 40), *e.number("flops", kMinRate, kMaxFlops)});
          });
      if (!listed) continue;
      std::sort(m.matmul_by_rows[dtype].begin(), m.matmul_by_rows[dtype].end(),
                [](const RowsRate& a, const RowsRate& b) { return a.rows < b.rows; });
    }
  }
  m.first_touch_seconds_per_byte = s.number("first_touch_seconds_per_byte", 0, 1).value_or(0);
  m.adamw_seconds_per_parameter = s.number("adamw_seconds_per_parameter", 0, 1).value_or(0);
  if (auto ring = s.section("ring_attention")) {
    ring->keys({"step_seconds", "seconds_per_score", "forward_share"}, {});
    m.ring_attention.step_seconds = ring->number("step_seconds", 0, 1e3).value_or(0);
    m.ring_attention.seconds_per_score = ring->number("seconds_per_score", 0, 1).value_or(0);
    m.ring_attention.forward_share = ring->number("forward_share", 0, 1).value_or(0);
  }
  m.lockstep_fraction = s.number("lockstep_fraction", 0, 10).value_or(0);
  if (auto disk = s.section("offload_disk")) {
    disk->keys({"dir", "state_bytes_per_s"}, {});
    DTORCH_CHECK_T(ConfigError, disk->has("dir") && disk->has("state_bytes_per_s"), path, ": ",
                   s.name("offload_disk"),
                   " needs dir and state_bytes_per_s: dtorch plan calibrate --offload-dir DIR "
                   "measures them, or leave offload_disk out");
    m.offload_disk.dir = *disk->text("dir");
    m.offload_disk.state_bytes_per_s =
        *disk->number("state_bytes_per_s", kMinRate, kMaxBytesPerSecond);
  }
  needed("intra_node");
  m.intra_node = read_links(*s.section("intra_node"), &warnings);
  if (auto inter = s.section("inter_node")) m.inter_node = read_links(*inter, &warnings);
  if (auto concurrent = s.section("inter_node_concurrent"))
    m.inter_node_concurrent = read_links(*concurrent, &warnings);
  if (auto overlap = s.section("overlap")) {
    overlap->keys(zero::stage_names(), {});
    for (const std::string& k : zero::stage_names())
      if (auto f = overlap->number(k, 0, 1)) m.overlap[k] = *f;
  }
  for (const std::string& w : warnings)
    log::warn(w);
  return m;
}

std::string machine_json(const Machine& m) {
  nlohmann::json j = {{"name", m.name},
                      {"device", m.device},
                      {"ranks_per_node", m.ranks_per_node},
                      {"memory_per_rank_bytes", m.memory_per_rank_bytes},
                      {"base_bytes_per_rank", m.base_bytes_per_rank},
                      {"matmul_flops", m.matmul_flops},
                      {"first_touch_seconds_per_byte", m.first_touch_seconds_per_byte},
                      {"adamw_seconds_per_parameter", m.adamw_seconds_per_parameter},
                      {"ring_attention",
                       {{"step_seconds", m.ring_attention.step_seconds},
                        {"seconds_per_score", m.ring_attention.seconds_per_score},
                        {"forward_share", m.ring_attention.forward_share}}},
                      {"lockstep_fraction", m.lockstep_fraction},
                      {"intra_node", links_json(m.intra_node)}};
  if (!m.inter_node.empty()) j["inter_node"] = links_json(m.inter_node);
  if (!m.inter_node_concurrent.empty())
    j["inter_node_concurrent"] = links_json(m.inter_node_concurrent);
  if (m.offload_disk.measured())
    j["offload_disk"] = {{"dir", m.offload_disk.dir},
                         {"state_bytes_per_s", m.offload_disk.state_bytes_per_s}};
  if (!m.overlap.empty()) j["overlap"] = m.overlap;
  if (!m.conv_flops.empty()) j["conv_flops"] = m.conv_flops;
  for (const auto& [dtype, rates] : m.matmul_by_rows)
    for (const RowsRate& r : rates)
      j["matmul_by_rows"][dtype].push_back({{"rows", r.rows}, {"flops", r.flops}});
  return j.dump(2) + "\n";
}

}  // namespace dtorch::plan
