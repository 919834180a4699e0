// Note [One run per folder]: what a run folder holds, a new run refused over another, and
// --overwrite's set-aside folder.
#include "dtorch/train/run_folder.h"

#include <algorithm>
#include <cctype>

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"

namespace dtorch::train {
namespace {

constexpr const char* kAside = ".overwritten";

// `name` is `prefix`, digits, then `suffix` (and, with `more`, anything after it).
bool numbered(const std::string& name, const std::string& prefix, const std::string& suffix,
              bool more = false) {
  if (name.rfind(prefix, 0) != 0) return false;
  size_t i = prefix.size();
  const size_t digits = i;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])))
    ++i;
  if (i == digits || name.compare(i, suffix.size(), suffix) != 0) return false;
  return more || i + suffix.size() == name.size();
}

// "pp0-of-2", "tp1-of-4": a stage's or tp index's folder.
bool part_folder(const std::string& name, const char* kind) {
  const size_t of = name.find("-of-");
  return of != std::string::npos && numbered(name.substr(0, of + 4), kind, "-of-") &&
         numbered(name.substr(of + 4), "", "");
}

// Files dtorch writes into a run folder, by name: a checkpoint file (and its temporaries), a
// model file, the pipeline's layout; and the folders: a sharded checkpoint's step (and its
// staging folder), a stage's, a tp index's.
bool saved_file(const std::string& name) {
  return name == "model.pt" || name == "model.safetensors" || name == "pipeline.json" ||
         name == "tensor_parallel.json" || numbered(name, "checkpoint-", ".dtc", true);
}
bool saved_folder(const std::string& name) {
  return numbered(name, "step-", "", true) || part_folder(name, "pp") || part_folder(name, "tp");
}

// What makes a folder hold a run: a checkpoint or a model, each of the kind dtorch writes (a
// folder the user named checkpoint-000002.dtc is not one).
bool saved_state(const std::string& dir, const std::string& name) {
  const std::string path = paths::join(dir, name);
  return saved_file(name) ? paths::is_regular_file(path)
                          : saved_folder(name) && paths::is_directory(path);
}

bool run_entry(const std::string& dir, const std::string& name) {
  const bool file =
      name == "config.json" || name == "metrics.jsonl" || numbered(name, "trace.rank", ".json");
  return saved_state(dir, name) || (file && paths::is_regular_file(paths::join(dir, name)));
}

std::vector<std::string> saved_states(const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& name : run_entries(dir))
    if (saved_state(dir, name)) out.push_back(name);
  return out;
}

// "model.pt, checkpoint-000001.dtc and 3 more".
std::string some_of(const std::vector<std::string>& names) {
  std::string text;
  const size_t shown = std::min<size_t>(names.size(), 4);
  for (size_t i = 0; i < shown; ++i)
    text += (i ? ", " : "") + names[i];
  if (names.size() > shown) text += str(" and ", names.size() - shown, " more");
  return text;
}

}  // namespace

std::vector<std::string> run_entries(const std::string& out) {
  std::error_code ec;
  std::vector<std::string> names;
  for (const std::string& name : paths::list_directory(out, ec))
    if (run_entry(out, name)) names.push_back(name);
  return names;
}

void check_run_folder(const TrainConfig& c, bool resumes) {
  const std::string& out = c.checkpointing.out;
  DTORCH_CHECK_T(ConfigError, !(c.checkpointing.resume && c.checkpointing.overwrite),
                 "--resume continues the run in ", out, " and --overwrite replaces it: give one");
  if (resumes || c.checkpointing.overwrite) return;
  const std::vector<std::string> held = saved_states(out);
  DTORCH_CHECK_T(ConfigError, held.empty(), "--out ", out, " holds another run (", some_of(held),
                 "): continue it with --resume, replace it with --overwrite (its files are ",
                 "removed once this run's first checkpoint is written), or give another --out");
  const std::string aside = paths::join(out, kAside);
  const std::vector<std::string> set_aside = saved_states(aside);
  DTORCH_CHECK_T(ConfigError, set_aside.empty(), "--out ", out,
                 " holds a run that an --overwrite stopped before its first checkpoint set ",
                 "aside in ", aside, " (", some_of(set_aside), "): continue it with --resume ",
                 "(it is put back first), replace it with --overwrite, or give another --out");
}

void prepare_run_folder(const TrainConfig& c, bool resumes) {
  const std::string& out = c.checkpointing.out;
  const std::string aside = paths::join(out, kAside);
  if (paths::exists(aside)) {
    if (!saved_states(out).empty()) {
      // The run that replaced it wrote its checkpoint and stopped before removing it.
      forget_overwritten_run(out);
    } else if (c.checkpointing.overwrite) {
      return;  // the replacing run again (restarted, or run anew): still set aside
    } else {
      for (const std::string& name : paths::list_directory(aside)) {
        const std::string to = paths::join(out, name);
        paths::remove_all(to);  // the stopped run's own (config.json, metrics.jsonl)
        paths::rename(paths::join(aside, name), to);
      }
      paths::remove(aside);
      log::info("put back the run in ", out, " that an --overwrite stopped before its first ",
                "checkpoint had set aside");
    }
  }
  if (!c.checkpointing.overwrite || resumes) return;
  const std::vector<std::string> earlier = run_entries(out);
  if (earlier.empty()) return;
  paths::create_directory(aside);
  for (const std::string& name : earlier)
    paths::rename(paths::join(out, name), paths::join(aside, name));
  log::info("--overwrite: the earlier run in ", out, " (", some_of(earlier), ") is set aside in ",
            aside, " until this run's first checkpoint is written");
}

void forget_overwritten_run(const std::string& out) {
  const std::string aside = paths::join(out, kAside);
  if (!paths::exists(aside)) return;
  paths::remove_all(aside);
  log::info("removed the run --overwrite replaced (", aside, ")");
}

}  // namespace dtorch::train
