// The run configuration (run_config.h): its JSON form through the one list of fields, the
// merge of a --config file with the flags given, validation, and resolve(), where every
// derived default is set.
#include "dtorch/train/config/run_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cfloat>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>

#include "dtorch/core/atomic_file.h"
#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"
#include "dtorch/core/json_config.h"
#include "dtorch/core/parse_whole_number.h"
#include "dtorch/core/paths.h"
#include "dtorch/models/registry.h"
#include "dtorch/report/profiler.h"
#include "dtorch/train/config/batch_sizes.h"
#include "dtorch/train/config/deepspeed_config.h"

namespace dtorch::train {
inline namespace config {
namespace {

using nlohmann::json;

// Writes each field into its section.
struct Writer {
  json& j;
  template <class T>
  void operator()(const Field& f, const T& v) {
    j[f.section][f.flag] = v;
  }
  void operator()(const Field& f, const std::optional<double>& v) {
    j[f.section][f.flag] = v ? json(*v) : json(nullptr);
  }
  template <class E>
  void operator()(const Field& f, const Named<E>& v) {
    j[f.section][f.flag] = v.name();
  }
  void operator()(const Field& f, const CountOr& v) {
    j[f.section][f.flag] = v.value == 0 ? json(v.word) : json(v.value);
  }
};

// The flags of each section.
struct KeyLister {
  std::map<std::string, json_config::Keys>& keys;
  template <class T>
  void operator()(const Field& f, const T&) {
    keys[f.section].push_back(f.flag);
  }
};

// Reads each field a section gives, checking its type (and an enum's names); the flags of those
// it read go into *given (when given).
struct Reader {
  const std::map<std::string, json_config::Section>& sections;
  std::set<std::string>* given;

  const json_config::Section* of(const Field& f) {
    auto it = sections.find(f.section);
    if (it == sections.end() || !it->second.has(f.flag)) return nullptr;
    if (given) given->insert(std::string("--") + f.flag);
    return &it->second;
  }
  template <class I>
  void whole(const Field& f, I& v) {
    const int64_t lo = std::is_signed<I>::value ? int64_t(std::numeric_limits<I>::min()) : 0;
    const int64_t hi = static_cast<int64_t>(
        std::min<uint64_t>(std::numeric_limits<I>::max(), std::numeric_limits<int64_t>::max()));
    if (auto* s = of(f)) v = static_cast<I>(*s->integer(f.flag, lo, hi));
  }
  void operator()(const Field& f, int& v) { whole(f, v); }
  void operator()(const Field& f, int64_t& v) { whole(f, v); }
  void operator()(const Field& f, uint64_t& v) { whole(f, v); }
  void operator()(const Field& f, bool& v) {
    if (auto* s = of(f)) v = *s->boolean(f.flag);
  }
  void operator()(const Field& f, double& v) {
    if (auto* s = of(f)) v = *s->number(f.flag, -DBL_MAX, DBL_MAX);
  }
  void operator()(const Field& f, std::optional<double>& v) {
    if (auto* s = of(f)) v = *s->number(f.flag, -DBL_MAX, DBL_MAX);
  }
  void operator()(const Field& f, std::string& v) {
    if (auto* s = of(f)) v = *s->text(f.flag);
  }
  void operator()(const Field& f, std::vector<double>& v) {
    auto* s = of(f);
    if (!s) return;
    const json& a = *s->get(f.flag);
    const bool pair = a.is_array() && a.size() == 2 && a[0].is_number() && a[1].is_number();
    DTORCH_CHECK_T(ConfigError, pair, s->file(), ": ", s->name(f.flag),
                   " must be a list of two numbers, as [0.9, 0.999] (got ", a.dump(), ")");
    v = {a[0].get<double>(), a[1].get<double>()};
  }
  template <class E>
  void operator()(const Field& f, Named<E> v) {
    if (auto* s = of(f)) v.set(*s->choice(f.flag, v.choices()));
  }
  void operator()(const Field& f, CountOr v) {
    auto* s = of(f);
    if (!s) return;
    const json& x = *s->get(f.flag);
    if (!x.is_string()) {
      v.value = *s->integer(f.flag, 0, std::numeric_limits<int64_t>::max());
      return;
    }
    DTORCH_CHECK_T(ConfigError, x == v.word, s->file(), ": ", s->name(f.flag), " must be \"",
                   v.word, "\" or a whole number >= 0 (got ", x.dump(), ")");
    v.value = 0;
  }
};

// The JSON-only part of a field: a DeepSpeed schedule's parameters (they come from a
// --deepspeed-config file's scheduler, not from flags).
constexpr const char* kDeepSpeedSchedule = "deepspeed-schedule";

// Not settings either: the size of the job that wrote the file (Note [The job's size in
// config.json]).
constexpr const char* kJobSection = "job";

JobSize read_job_size(const json& j, const std::string& file) {
  std::vector<std::string> warnings;
  json_config::Section top(j, "", file, &warnings, /*auto_is_absent=*/false);
  const auto s = top.section(kJobSection);
  if (!s) return {};
  s->keys({"nnodes", "nproc-per-node", "world-size"}, {});
  constexpr int64_t kMost = 1 << 24;
  JobSize job;
  job.nnodes = static_cast<int>(s->integer("nnodes", 1, kMost).value_or(0));
  job.nproc_per_node = static_cast<int>(s->integer("nproc-per-node", 1, kMost).value_or(0));
  job.world_size = static_cast<int>(s->integer("world-size", 1, kMost).value_or(0));
  DTORCH_CHECK_T(ConfigError,
                 job.nnodes > 0 && job.nproc_per_node > 0 &&
                     int64_t{job.nnodes} * job.nproc_per_node == job.world_size,
                 file, ": job says nnodes ", job.nnodes, " x nproc-per-node ", job.nproc_per_node,
                 " = world-size ", job.world_size,
                 ", which is not a job's size; give all three as a run wrote them, or leave the "
                 "section out");
  return job;
}

}  // namespace

int64_t parse_count_or(const std::string& text, const std::string& flag, const std::string& word) {
  if (text == word) return 0;
  const std::optional<int64_t> n = parse_whole_number(text);
  DTORCH_CHECK_T(ConfigError, n && *n >= 0, flag, " takes a whole number >= 0 or ", word, " (got ",
                 text, ")");
  return *n;
}

const std::vector<std::string>& config_sections() {
  // In the order the fields first name them.
  static const std::vector<std::string> sections = [] {
    std::vector<std::string> order;
    TrainConfig c;
    visit_fields(c, [&](const Field& f, const auto&) {
      if (std::find(order.begin(), order.end(), f.section) == order.end())
        order.push_back(f.section);
    });
    return order;
  }();
  return sections;
}

json to_json(const TrainConfig& config) {
  TrainConfig c = config;
  json j = json::object();
  for (const auto& s : config_sections())
    j[s] = json::object();
  visit_fields(c, Writer{j});
  if (is_deepspeed_schedule(c.training.lr_schedule.kind))
    j["optimizer"][kDeepSpeedSchedule] = json(c.training.lr_schedule)["deepspeed"];
  return j;
}

TrainConfig from_json(const json& j, const std::string& file, const TrainConfig& base,
                      std::set<std::string>* given) {
  TrainConfig c = base;
  std::map<std::string, json_config::Keys> keys;
  visit_fields(c, KeyLister{keys});
  keys["optimizer"].push_back(kDeepSpeedSchedule);
  std::vector<std::string> warnings;
  json_config::Section top(j, "", file, &warnings, /*auto_is_absent=*/false);
  top.keys(config_sections(), {kJobSection});
  std::map<std::string, json_config::Section> sections;
  for (const auto& name : config_sections()) {
    if (auto s = top.section(name)) {
      s->keys(keys[name], {});
      sections.emplace(name, *s);
    }
  }
  visit_fields(c, Reader{sections, given});
  auto opt = sections.find("optimizer");
  if (opt != sections.end() && opt->second.has(kDeepSpeedSchedule)) {
    try {
      json schedule = c.training.lr_schedule;
      schedule["deepspeed"] = *opt->second.get(kDeepSpeedSchedule);
      c.training.lr_schedule.deepspeed = schedule.get<LrScheduleConfig>().deepspeed;
    } catch (const json::exception&) {
      DTORCH_FAIL(ConfigError, file, ": optimizer.", kDeepSpeedSchedule,
                  " must hold DeepSpeed's scheduler parameters as a config.json of dtorch "
                  "writes them; take them from one, or leave the key out");
    }
  }
  return c;
}

TrainConfig read_config_file(const std::string& path, std::set<std::string>* keys, JobSize* job) {
  std::string text, problem;
  DTORCH_CHECK_T(ConfigError, read_input_file(path, kMaxTextFileBytes, &text, &problem),
                 "--config ", path, ": ", problem,
                 "; give the config.json of a run (dtorch train writes one into its --out), or "
                 "one --print-config printed");
  const TrainConfig defaults;  // named: GCC 12 warns of a temporary's vectors as uninitialized
  const json j = json_config::parse(text, path);
  TrainConfig c = from_json(j, path, defaults, keys);
  if (job) *job = read_job_size(j, path);
  return c;
}

json config_file_json(const TrainConfig& c, const JobSize& job) {
  json j = to_json(c);
  if (job.known()) {
    j[kJobSection] = {{"nnodes", job.nnodes},
                      {"nproc-per-node", job.nproc_per_node},
                      {"world-size", job.world_size}};
  }
  return j;
}

void write_config_file(const TrainConfig& c, const JobSize& job, const std::string& path) {
  std::error_code ec;
  paths::create_directories(paths::parent_path(path), ec);
  const std::string text = config_file_json(c, job).dump(2) + "\n";
  if (auto why = write_file_atomically(path, text.data(), text.size()))
    DTORCH_FAIL(CheckpointError, *why);
}

TrainConfig overlay_flags(const TrainConfig& file, const TrainConfig& flags_config,
                          const std::set<std::string>& flags) {
  json j = to_json(file);
  const json given = to_json(flags_config);
  std::map<std::string, json_config::Keys> keys;
  TrainConfig defaults;  // named: GCC 12 warns of a temporary's vectors as uninitialized
  visit_fields(defaults, KeyLister{keys});
  for (const auto& [section, section_flags] : keys)
    for (const auto& flag : section_flags)
      if (flags.count("--" + flag)) j[section][flag] = given[section][flag];
  if (flags.count("--lr-schedule")) {  // a schedule's parameters go with its kind
    j["optimizer"].erase(kDeepSpeedSchedule);
    if (given["optimizer"].contains(kDeepSpeedSchedule))
      j["optimizer"][kDeepSpeedSchedule] = given["optimizer"][kDeepSpeedSchedule];
  }
  TrainConfig c = from_json(j, "the command line", defaults);
  c.checkpointing.resume = flags_config.checkpointing.resume;
  c.checkpointing.overwrite = flags_config.checkpointing.overwrite;
  c.reporting.progress = flags_config.reporting.progress;
  if (!flags.count("--progress")) c.reporting.progress.mode = file.reporting.progress.mode;
  return c;
}

void validate(const TrainConfig& c) {
  const TrainingConfig& t = c.training;
  const ParallelismConfig& p = c.parallelism;
  const StrategyConfig& s = c.strategy;
  auto names = models::model_names();
  DTORCH_CHECK_T(ConfigError, std::find(names.begin(), names.end(), c.model.name) != names.end(),
                 "unknown model '", c.model.name, "'; choose one of: ", joined(names));
  validate_data(c.data.source, c.data.loader, c.model.name.rfind("gpt", 0) == 0);
  DTORCH_CHECK_T(ConfigError, t.epochs >= 1, "--epochs must be >= 1 (got ", t.epochs, ")");
  DTORCH_CHECK_T(ConfigError, t.batch_size >= 1, "--batch-size must be >= 1 (got ", t.batch_size,
                 ")");
  DTORCH_CHECK_T(ConfigError, c.data.train_samples >= 0,
                 "--train-samples must be >= 1, or all for the whole training split (got ",
                 c.data.train_samples, ")");
  DTORCH_CHECK_T(ConfigError, c.data.test_samples >= 0,
                 "--test-samples must be >= 1, or all for the whole test split (got ",
                 c.data.test_samples, ")");
  DTORCH_CHECK_T(ConfigError, c.model.seq_len >= 0,
                 "--seq-len must be >= 1, or 0 for the model's longest sequence (got ",
                 c.model.seq_len, ")");
  validate(s.optimizer);
  validate(t.lr_schedule, s.optimizer.lr);
  DTORCH_CHECK_T(ConfigError, t.accum_steps >= 1, "--accum-steps must be >= 1");
  DTORCH_CHECK_T(ConfigError, t.clip_grad_norm >= 0, "--clip-grad-norm must be >= 0 (0: off)");
  DTORCH_CHECK_T(ConfigError, !c.checkpointing.out.empty(), "--out must name a directory");
  DTORCH_CHECK_T(ConfigError, c.checkpointing.keep >= 1, "--keep-checkpoints must be >= 1");
  DTORCH_CHECK_T(ConfigError, c.reporting.print_every >= 0,
                 "--print-every must be >= 1, or 0 for a line per epoch only");
  report::parse_step_range(c.reporting.profile, "--profile");
  validate(p);
  DTORCH_CHECK_T(ConfigError, p.tp == 1 || t.clip_grad_norm == 0,
                 "--clip-grad-norm with --tp is not supported yet (the norm of split parameters "
                 "needs a sum across the tp group); leave it at 0");
  if (p.pp > 1) {
    DTORCH_CHECK_T(ConfigError, t.accum_steps == 1, "--accum-steps with --pp: the pipeline ",
                   "already accumulates over its micro-batches; raise --microbatches and ",
                   "--batch-size instead");
    DTORCH_CHECK_T(ConfigError, p.microbatches == 0 || t.batch_size % p.microbatches == 0,
                   "--batch-size ", t.batch_size, " cannot be cut into --microbatches ",
                   p.microbatches, " equal micro-batches; make it a multiple of ", p.microbatches);
    // Note [ZeRO-3 under a pipeline]
    DTORCH_CHECK_T(ConfigError,
                   !s.reshard_after_microbatch || p.schedule == pp::ScheduleKind::OneFOneB ||
                       p.schedule == pp::ScheduleKind::GPipe,
                   "--reshard-after-microbatch with --schedule ", name_of(p.schedule),
                   ": ZeRO-3 then gathers a unit as each micro-batch's backward reaches it, which "
                   "this schedule does not signal; use --schedule 1f1b or gpipe, or leave the "
                   "flag out (units gathered once per step)");
  }
  DTORCH_CHECK_T(ConfigError,
                 !s.reshard_after_microbatch || (s.kind == StrategyKind::Zero3 && p.pp > 1),
                 "--reshard-after-microbatch releases ZeRO-3's units between a pipeline's "
                 "micro-batches: it needs --strategy zero3 and --pp 2 or more (got --strategy ",
                 name_of(s.kind), ", --pp ", p.pp, ")");
  if (p.dp_replicate != 1)
    check_replicas_need_zero(s.kind, p.dp_replicate == 0 ? "auto" : str(p.dp_replicate));
  StrategyConfig named = s;
  named.model = c.model.name;
  validate(named);
}

int default_microbatches(int pp, pp::ScheduleKind schedule, int64_t batch) {
  const bool interleaved = schedule == pp::ScheduleKind::Interleaved;
  for (int m = 2 * pp; m >= 1; --m)
    if (batch % m == 0 && (!interleaved || m % pp == 0)) return m;
  DTORCH_FAIL(ConfigError, "--batch-size ", batch, " cannot be cut into micro-batches for the ",
              "interleaved schedule over ", pp, " stages (it sends them in groups of ", pp,
              "); make --batch-size a multiple of ", pp);
}

namespace {

int64_t global_batch(const TrainConfig& c, int world) {
  const int64_t accum = c.parallelism.pp > 1 ? 1 : c.training.accum_steps;  // micro-batches cut
  return c.training.batch_size * accum * data_parallel_size(c.parallelism, world);
}

// Note [The job's size in config.json]: a --config file's run at another size keeps its global
// batch when no batch flag chooses one and this job's data-parallel ranks divide it; the batch
// per rank stays the file's where it can, so a rank's memory stays what it was. What it did
// goes into `r`'s notes; what it could not, into its warnings (after resolve()).
struct SizeChange {
  bool changes = false;
  int64_t then = 0;     // the file's global batch
  bool chosen = false;  // a batch flag, --global-batch-size or --deepspeed-config chooses one
  bool kept = false;
};

SizeChange keep_the_files_global_batch(ConfigSources& src, const TrainConfig& c) {
  SizeChange s;
  if (!src.config_file || !src.config_file_job.known() ||
      src.config_file_job.world_size == src.world_size)
    return s;
  s.changes = true;
  s.then = global_batch(*src.config_file, src.config_file_job.world_size);
  for (const char* chooses :
       {"--batch-size", "--accum-steps", "--microbatches", "--global-batch-size"})
    s.chosen = s.chosen || src.command_line.count(chooses) > 0;
  s.chosen = s.chosen || src.global_batch_size > 0 || !src.deepspeed_config.empty();
  if (s.chosen) return s;
  const int dp = data_parallel_size(c.parallelism, src.world_size);
  if (s.then % dp != 0) return s;
  src.global_batch_size = s.then;
  src.given.erase("--accum-steps");
  src.given.erase("--microbatches");
  // A batch size below 1 fails validate() later, naming the flag; it divides nothing here.
  const bool batch_fits = c.parallelism.pp == 1 && c.training.batch_size > 0 &&
                          s.then % (c.training.batch_size * dp) == 0;
  if (!batch_fits) src.given.erase("--batch-size");
  s.kept = true;
  return s;
}

std::string ranks(const JobSize& j) {
  return str(j.world_size, " rank(s) (", j.nnodes, " node(s) x ", j.nproc_per_node, ")");
}

}  // namespace

Resolution resolve(TrainConfig& c, const ConfigSources& sources) {
  Resolution r;
  ConfigSources src = sources;
  const SizeChange size = keep_the_files_global_batch(src, c);
  auto given = [&](const char* flag) { return src.given.count(flag) > 0; };
  if (!src.deepspeed_config.empty()) {
    const auto ds = read_deepspeed_config(src.deepspeed_config);
    r.warnings = ds.warnings;
    r.notes = apply_deepspeed_config(ds, src.command_line, src.world_size, c);
    r.notes.push_back(str("--deepspeed-config ", src.deepspeed_config, ": ",
                          name_of(c.strategy.kind), ", ", name_of(c.strategy.precision.compute),
                          ", ", name_of(c.strategy.optimizer.kind), " lr ", c.strategy.optimizer.lr,
                          ", batch ", c.training.batch_size, " per rank x ", c.training.accum_steps,
                          " accumulation step(s), schedule ",
                          name_of(c.training.lr_schedule.kind)));
  }
  ParallelismConfig& p = c.parallelism;
  TrainingConfig& t = c.training;
  const int dp = data_parallel_size(p, src.world_size);
  if (src.global_batch_size > 0) {
    // --global-batch-size: the batch per rank follows the job's size, by DeepSpeed's rule, so an
    // elastic job that goes on with fewer nodes takes the same optimizer steps over the same
    // samples (the sampler strides the epoch's order over the ranks).
    auto flag = [&](const char* name, int64_t v) {
      return given(name) && v > 0 ? std::optional<int64_t>(v) : std::nullopt;
    };
    const BatchNames names{"--global-batch-size", "--batch-size", "--accum-steps"};
    if (p.pp > 1) {
      set_pipeline_batch_sizes(
          resolve_pipeline_batch(src.global_batch_size, flag("--batch-size", t.batch_size),
                                 flag("--microbatches", p.microbatches), std::nullopt, dp,
                                 {"--global-batch-size", "--batch-size", "--microbatches"}),
          c);
    } else {
      set_batch_sizes(resolve_batch_sizes(src.global_batch_size, flag("--batch-size", t.batch_size),
                                          flag("--accum-steps", t.accum_steps), dp, names),
                      c);
    }
  }
  if (p.pp > 1 && p.microbatches == 0) {  // Note [Micro-batches]
    p.microbatches = default_microbatches(p.pp, p.schedule, t.batch_size);
    if (p.microbatches != 2 * p.pp) {
      r.notes.push_back(str("--microbatches ", p.microbatches, ": 2 x --pp (", 2 * p.pp,
                            ") does not divide --batch-size ", t.batch_size));
    }
  }
  if (size.changes) {
    const std::string then = str("--config ", src.config_file_name, ": its run had ",
                                 ranks(src.config_file_job), ", this job has ", src.world_size);
    const int64_t now = global_batch(c, src.world_size);
    if (size.kept) {
      r.notes.push_back(str(then, "; the global batch stays ", now,
                            ", so the steps per epoch and the schedule stay the run's"));
    } else if (now != size.then) {
      r.warnings.push_back(
          str(then, "; the global batch changes from ", size.then, " to ", now,
              " samples per optimizer step, and the steps per epoch with it: ",
              size.chosen ? std::string("the batch flags given choose it")
                          : str(size.then, " is not a multiple of this job's ", dp,
                                " data-parallel rank(s); give --global-batch-size to choose it")));
    }
  }
  if (src.global_batch_size > 0) {
    r.notes.push_back(str(size.kept ? "global batch " : "--global-batch-size ",
                          src.global_batch_size, ": batch ", t.batch_size, " per rank",
                          p.pp > 1 ? str(" in ", p.microbatches, " micro-batch(es)")
                                   : str(" x ", t.accum_steps, " accumulation step(s)"),
                          " x ", dp, " data-parallel rank(s)"));
  }
  c.strategy.optimizer.weight_decay = weight_decay_of(c.strategy.optimizer);
  validate(c);
  return r;
}

}  // namespace config
}  // namespace dtorch::train
