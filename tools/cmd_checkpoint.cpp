// `dtorch checkpoint inspect|consolidate`: what a sharded checkpoint holds and whether its files
// are intact, and the whole model as one state dict that Python's torch.load reads.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/checkpoint/consolidate.h"
#include "dtorch/checkpoint/sharded_checkpoint.h"
#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/models/registry.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct CheckpointFlags {
  std::string dir;
  std::string out;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// A one-file checkpoint (Note [Checkpoint format]): read whole, so its length and CRC-32 are
// verified before anything is printed.
int inspect_file(const std::string& path) {
  auto [model, d] = checkpoint::read_checkpoint_model(path);
  std::ostream& o = std::cout;
  o << "checkpoint   " << path << "\n"
    << "format       one file (checkpoint-NNNNNN.dtc)\n"
    << "epoch        " << d.epoch << "\n"
    << "global step  " << d.global_step << "\n"
    << "metadata     " << d.metadata_json << "\n"
    << "model\n";
  for (const auto& [name, t] : model)
    o << "    " << std::left << std::setw(36) << name << " " << std::setw(18)
      << shape_text(t.sizes().vec()) << " " << t.numel() << "\n";
  o << "file " << paths::file_name(path) << ": " << paths::file_size(path)
    << " bytes, length and CRC-32 ok\n";
  return 0;
}

int run_inspect(const CheckpointFlags& f) {
  if (paths::is_regular_file(f.dir)) return inspect_file(f.dir);
  checkpoint::ShardedCheckpointReader reader(f.dir);
  const auto& d = reader.data();
  std::ostream& o = std::cout;
  o << "checkpoint   " << reader.dir() << "\n"
    << "format       version " << reader.version() << "\n"
    << "world size   " << reader.world_size() << " (at save)\n"
    << "epoch        " << d.epoch << "\n"
    << "global step  " << d.global_step << "\n"
    << "metadata     " << d.metadata_json << "\n";
  auto row = [&](const std::string& a, const std::string& b, const std::string& c) {
    o << "    " << std::left << std::setw(36) << a << " " << std::setw(18) << b << " " << c << "\n";
  };
  const auto& flat = reader.flat_tensors();
  for (const auto& [unit, layout] : d.layouts) {
    auto it = flat.find("param/" + unit);
    o << "unit " << unit << ": param/" << unit;
    if (it != flat.end()) o << ", " << it->second.numel << " elements";
    o << ", " << layout.size() << " parameters\n";
    for (const auto& e : layout) {
      int64_t n = 1;
      for (int64_t s : e.shape)
        n *= s;
      row(e.name, shape_text(e.shape), std::to_string(n));
    }
  }
  o << "optimizer state\n";
  for (const auto& [key, info] : flat)
    if (starts_with(key, "optim/"))
      row(key, std::to_string(info.numel) + " elements", str(info.dtype));
  for (const auto& [key, info] : reader.full_tensors())
    if (starts_with(key, "optim/")) row(key, shape_text(info.shape), str(info.dtype));
  o << "buffers and other tensors\n";
  for (const auto& [key, info] : flat)
    if (!starts_with(key, "optim/") && !starts_with(key, "param/"))
      row(key, std::to_string(info.numel) + " elements", str(info.dtype));
  for (const auto& [key, info] : reader.full_tensors())
    if (!starts_with(key, "optim/")) row(key, shape_text(info.shape), str(info.dtype));
  o << "files\n";
  int bad = 0;
  std::string bad_names;
  for (const auto& s : reader.check_files()) {
    const std::string name = paths::file_name(s.path);
    const std::string size =
        s.actual_bytes < 0 ? "missing" : std::to_string(s.actual_bytes) + " bytes";
    row(name, size, s.ok ? "ok" : "BAD: " + s.problem);
    if (!s.ok) {
      ++bad;
      bad_names += " " + name;
    }
  }
  o.flush();
  DTORCH_CHECK_T(CheckpointError, bad == 0, bad, " file(s) of checkpoint ", reader.dir(),
                 " failed verification:", bad_names,
                 ". Fall back to an older step directory or re-run the save.");
  return 0;
}

// The Python aliases of the model the trainer recorded in a checkpoint's metadata ("model");
// none when it names none (a checkpoint written through the library's own API).
std::vector<models::PythonAlias> aliases_of(const std::string& metadata_json) {
  auto meta = nlohmann::json::parse(metadata_json, nullptr, false);
  if (!meta.is_object() || !meta.contains("model") || !meta["model"].is_string()) return {};
  const std::string name = meta["model"].get<std::string>();
  const auto names = models::model_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) return {};
  return models::python_aliases(name);
}

// consolidate writes one file beside the checkpoint it reads: never one it reads, never into a
// step folder (the run's checkpoints, which a later --resume reads), never under a checkpoint's
// .dtc name. Checked before anything is read, so a refused OUT costs nothing.
void refuse_output_that_is_input(const std::string& out, const std::string& in) {
  const std::string fix = "; write DIR/model.pt or DIR/model.safetensors outside the checkpoints";
  DTORCH_CHECK_T(ConfigError, !paths::file_name(out).empty() && !paths::is_directory(out), "OUT ",
                 out, " is a folder, not a file name", fix);
  DTORCH_CHECK_T(ConfigError, paths::extension(out) != ".dtc", "OUT ", out,
                 " has a checkpoint's name (.dtc), which --resume would read as one", fix);
  std::error_code ec;
  const std::string parent = paths::parent_path(out);
  const std::string folder = paths::canonical(parent.empty() ? "." : parent, ec);
  if (ec) return;  // a missing folder: the write names it
  DTORCH_CHECK_T(ConfigError,
                 !paths::exists(paths::join(folder, "metadata.json")) &&
                     !starts_with(paths::file_name(folder), "step-"),
                 "OUT ", out, " is inside the sharded checkpoint ", folder,
                 ", which writing it would change", fix);
  const std::string target = paths::join(folder, paths::file_name(out));
  for (const std::string& input : {in, in + "/tensor_parallel.json", in + "/pipeline.json"}) {
    const std::string read = paths::canonical(input, ec);
    DTORCH_CHECK_T(ConfigError, ec || read != target, "OUT ", out, " is ", input,
                   ", which consolidate reads", fix);
  }
}

int run_consolidate(const CheckpointFlags& f) {
  refuse_output_that_is_input(f.out, f.dir);
  auto [state, data, source] = checkpoint::consolidate(f.dir);
  // The format follows the file name: .safetensors gets safetensors, anything else torch.save's,
  // which also holds the model's tied weights under their Python names (Note [Tied embedding]).
  const bool st = f.out.size() >= 12 && f.out.compare(f.out.size() - 12, 12, ".safetensors") == 0;
  if (!st) state = checkpoint::with_python_aliases(state, aliases_of(data.metadata_json));
  checkpoint::write_file_atomically(
      f.out, checkpoint::serialize_state_dict(
                 state, st ? checkpoint::SaveFormat::Safetensors : checkpoint::SaveFormat::Torch));
  int64_t elements = 0;
  for (const auto& [name, t] : state)
    elements += t.numel();
  std::cout << "wrote " << f.out << ": " << state.size() << " tensors, " << elements
            << " elements, from " << source << " (epoch " << data.epoch << ", global step "
            << data.global_step << ")\n";
  return 0;
}

}  // namespace

void add_checkpoint_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<CheckpointFlags>();
  auto* cmd = app.add_subcommand("checkpoint", "Inspect or consolidate a sharded checkpoint");
  cmd->require_subcommand(1);
  const std::string dir_help =
      "a run's checkpoint directory (its newest intact checkpoint), a step-NNNNNN directory, or "
      "a checkpoint-NNNNNN.dtc file";

  auto* inspect = cmd->add_subcommand(
      "inspect", "Print what a checkpoint holds and verify each file's size and checksum");
  inspect->add_option("DIR", f->dir, dir_help)->required();
  inspect->callback([f, &exit_code] { exit_code = run_inspect(*f); });

  auto* consolidate = cmd->add_subcommand(
      "consolidate", "Write the whole model (parameters and buffers) as one state dict file");
  consolidate->add_option("DIR", f->dir, dir_help)->required();
  consolidate
      ->add_option("OUT", f->out,
                   "output file: model.pt (torch.load reads it) or model.safetensors")
      ->required();
  consolidate->callback([f, &exit_code] { exit_code = run_consolidate(*f); });
}

}  // namespace dtorch::tools
