// Files in torch.save's format that Python's torch.load reads as they are, including with
// weights_only=True, its default from PyTorch 2.6. See Note [Files torch.load reads].
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dtorch/core/atomic_file.h"

namespace dtorch::checkpoint {

/// Whether each record of an archive carries the CRC-32 of its bytes: files meant for Python
/// and zip tools do; a file that checksums all of its bytes itself leaves them out where the
/// LibTorch can (Note [One checksum per file]).
enum class RecordCrcs { Computed, LeftOut };

/// The bytes torch.save would write for `value`: a zip archive of a pickle (protocol 2) and one
/// record per tensor storage. Dicts, lists, strings, numbers, None and CPU tensors only; a dict
/// becomes a plain Python dict (insertion order kept).
std::vector<char> torch_save_bytes(const c10::IValue& value);
/// The same bytes appended to `out`, which is grown once to hold them (a checkpoint's payload
/// is gigabytes: no copy of it is made on the way).
void append_torch_save(const c10::IValue& value, std::vector<char>& out,
                       RecordCrcs crcs = RecordCrcs::Computed);
/// The same bytes handed to `sink` as they are made (a shard of gigabytes is never held twice).
void stream_torch_save(const c10::IValue& value, const ByteSink& sink,
                       RecordCrcs crcs = RecordCrcs::Computed);

/// Hands the values of the k-th storage of a file being streamed (StorageStream).
using TakeStorage = std::function<void(size_t k, const at::Tensor& values)>;
/// Hands every storage of a file being written, one at a time: calls take(k, values) for k = 0,
/// 1, ... in order, each `values` a CPU tensor that need live only during its call.
using StorageStream = std::function<void(const TakeStorage& take)>;

/// torch.save's bytes for a dict name -> tensor whose values come one storage at a time, so a
/// model bigger than memory is written as it is gathered (Note [Model files written as they are
/// gathered] in state_dict.h). `shapes` lists the entries with tensors that give only their dtype
/// and shape (meta tensors do; entries that share one tensor share one storage, as tied weights
/// do); storage k is the k-th distinct tensor of `shapes`, which `fill` hands contiguous. Throws
/// std::logic_error when `fill` hands a storage out of order, of another size, or not at all.
void stream_torch_save_dict(const std::vector<std::pair<std::string, at::Tensor>>& shapes,
                            const StorageStream& fill, const ByteSink& sink,
                            RecordCrcs crcs = RecordCrcs::Computed);

/// What a file in torch.save's format refused before LibTorch reads it is; what() is a phrase
/// that follows the file's name ("is not a zip archive ...").
struct UnreadableArchive : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The value torch::pickle_load reads from `bytes` (torch.save's format, tagged or not), with
/// what would crash LibTorch's reader refused first by an UnreadableArchive: an archive that is
/// not whole, and a container type tag that is not a plain type. See Note [Reading untrusted
/// archives]. Anything else wrong is LibTorch's own exception.
c10::IValue load_torch_save(const std::vector<char>& bytes);

/// load_torch_save of `n` bytes at `bytes` (a mapped file) without copying its tensors: each
/// tensor's storage is its record where it lies, and keeps `bytes` alive, so a shard of
/// gigabytes is read only where it is used. The bytes must be writable (a copy-on-write mapping
/// is: writes to a tensor never reach the file). A storage that would run past the bytes is
/// refused by an UnreadableArchive.
c10::IValue load_torch_save_in_place(std::shared_ptr<char> bytes, size_t n);

/// Refuses with an UnreadableArchive what torch::serialize::InputArchive must not be given: a
/// zip archive that is not whole, or a module whose code is anything but what
/// torch::serialize::OutputArchive writes (modules of typed attributes). Note [Reading
/// untrusted archives].
void check_serialize_archive(const std::string& bytes);

}  // namespace dtorch::checkpoint
