// A module's parameters and buffers as a name -> tensor dict, saved in the file format of
// Python's torch.save, so `model.load_state_dict(torch.load(path))` works in PyTorch.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtorch/checkpoint/save_format.h"
#include "dtorch/checkpoint/torch_save.h"
#include "dtorch/core/atomic_file.h"
#include "dtorch/core/enum_names.h"
#include "dtorch/models/model.h"

namespace dtorch::checkpoint {

/// Parameters then buffers, in registration order, under their dotted names
/// ("conv1.weight"): the keys Python's Module.state_dict() uses for the same model.
using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

/// The module's state (detached tensors sharing storage with the module).
StateDict state_dict(const torch::nn::Module& module);

/// `state` in host memory, as files hold it: a tensor on another device is copied to the CPU,
/// once per tensor, so two keys that share a tensor (tied weights) still share its copy. CPU
/// tensors are kept as they are, or with `snapshot` copied too (host_snapshot), so that later
/// changes to the state do not reach the result.
StateDict host_copy(const StateDict& state, bool snapshot = false);

/// A copy of `t` in host memory that later changes to `t` do not reach: what a checkpoint
/// written in the background holds (pinned memory for a GPU tensor, copied at full speed).
torch::Tensor host_snapshot(const torch::Tensor& t);

/// `state` with each alias whose parameter it holds added right after that parameter, as the
/// same tensor: what Python's state_dict() of a model with tied weights lists, and what
/// torch.save writes as one storage under two keys. Unchanged when no alias applies.
StateDict with_python_aliases(StateDict state, const std::vector<models::PythonAlias>& aliases);

/// Serialises a state dict as a pickled dict name -> tensor, the bytes of a file Python's
/// torch.load reads, weights_only included (Note [Files torch.load reads]).
std::vector<char> pickle_state_dict(const StateDict& state);
/// The same bytes handed to `sink` as they are made, with `crcs` in each record.
void stream_state_dict(const StateDict& state, const ByteSink& sink, RecordCrcs crcs);
/// Parses what pickle_state_dict (or Python's torch.save of a state dict) wrote. Throws
/// CheckpointError naming `source` when the bytes are not a dict of tensors.
StateDict unpickle_state_dict(const std::vector<char>& bytes, const std::string& source);

/// The elements of `shape` as a file gave it, or -1 when a dimension is negative or they would
/// exceed `limit` (checked before each multiplication, so a damaged shape cannot overflow): what
/// a reader asks before it allocates a tensor of that shape.
int64_t elements_within(const std::vector<int64_t>& shape, int64_t limit);

/// Checks that `state` has exactly the module's keys with the same shapes, without changing
/// anything; throws CheckpointError listing missing keys, unexpected keys and shape
/// mismatches, naming `source` (a file name, for the message). A dtorch model's Python
/// aliases (models::Model::python_aliases) may be present beside their parameter, holding
/// the same values (else CheckpointError: the file's weights are not tied); they are ignored.
void check_state_dict(const torch::nn::Module& module, const StateDict& state,
                      const std::string& source);
/// check_state_dict, then copies every tensor into the module (converting dtype if needed).
void load_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& source);

/// A state dict's bytes in `format`.
std::vector<char> serialize_state_dict(const StateDict& state, SaveFormat format);

/// Note [Model files written as they are gathered]
/// A ZeRO-3 model may be bigger than one rank's memory, and its model file bigger too: the file
/// is written as the model is gathered, one unit at a time, never whole in memory. The writer
/// first learns every entry's name, dtype and shape (shapes_of: meta tensors) and writes what
/// comes before the data (safetensors' header). Then the strategy gathers the units in turn and
/// hands each parameter, which goes to the file at once and is let go; torch.save's format takes
/// the storages in any order and puts its pickle, which only names them, after them. A rank
/// holds one gathered unit beyond what training holds, and rank 0 one tensor's host copy.

/// Takes a state dict's tensors, by name, as they are made.
using TakeTensor = std::function<void(const std::string& name, const torch::Tensor& values)>;

/// `state` with each tensor replaced by a meta tensor of its dtype and shape (entries that share a
/// tensor still share one).
StateDict shapes_of(const StateDict& state);

/// Writes in `format` to `sink` the state dict whose entries `shapes` names (shapes_of), while
/// `fill` hands their values by name in `shapes`' order, each copied to the host and written
/// before the next comes (Note [Model files written as they are gathered]). Entries that share a
/// tensor in `shapes` (Python aliases) are handed once, under the first name.
void stream_state_dict(const StateDict& shapes, SaveFormat format,
                       const std::function<void(const TakeTensor&)>& fill, const ByteSink& sink);

/// Writes the module's state to `path` atomically: path.tmp, fsync, rename, so a crash never
/// leaves a half-written file under `path`. Throws CheckpointError when it cannot. In
/// torch.save's format a dtorch model's Python aliases are written too (with_python_aliases),
/// so the Python module loads the file with strict=True; safetensors holds no shared tensors,
/// and its Python loader safetensors.torch.load_model restores tied weights itself.
void save_state_dict(const torch::nn::Module& module, const std::string& path,
                     SaveFormat format = SaveFormat::Torch);
/// Reads `path` (written by save_state_dict in either format, by safetensors' save_file, or
/// by Python as torch.save(dict(model.state_dict()), path): LibTorch 1.13 cannot unpickle the
/// OrderedDict that state_dict() itself returns) into the module; throws CheckpointError on
/// unreadable files and on key or shape mismatches.
void load_state_dict(torch::nn::Module& module, const std::string& path);

/// Writes `bytes` to `path` atomically (core/atomic_file.h); CheckpointError says why when it
/// cannot, and whatever was at `path` before is untouched.
void write_file_atomically(const std::string& path, const std::vector<char>& bytes);
/// The whole file; throws CheckpointError naming it when it cannot be read.
std::vector<char> read_file(const std::string& path);
/// Hands the file's bytes to `each` in pieces of a few MiB, in order (a file of gigabytes is
/// never held whole); returns how many there were. CheckpointError as read_file.
uint64_t read_file_in_pieces(const std::string& path,
                             const std::function<void(const char*, size_t)>& each);

/// A file mapped into memory copy-on-write: its pages are read as they are touched, writes to
/// them stay in this process.
struct MappedFile {
  std::shared_ptr<char> bytes;  ///< unmapped when the last holder lets go
  size_t size = 0;
};
/// Throws CheckpointError naming the file when it cannot be opened or mapped.
MappedFile map_file(const std::string& path);
/// unpickle_state_dict of a mapped file, its tensors in place in the mapping (each keeps it
/// alive): a state dict of gigabytes costs memory only where it is read.
StateDict unpickle_state_dict(const MappedFile& file, const std::string& source);

}  // namespace dtorch::checkpoint
