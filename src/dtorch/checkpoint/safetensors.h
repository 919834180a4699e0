// State dicts in the safetensors format (Hugging Face's): an 8-byte header length, a JSON
// header naming each tensor's dtype, shape and byte range, then the raw little-endian bytes.
// No code runs on load, which is why many users ask for it instead of pickles.
#pragma once

#include <string>
#include <vector>

#include "dtorch/checkpoint/state_dict.h"

namespace dtorch::checkpoint {

/// The bytes of a .safetensors file holding `state` in its order. `metadata` goes under
/// "__metadata__" (string -> string). Throws CheckpointError for a dtype safetensors lacks.
std::vector<char> safetensors_bytes(
    const StateDict& state, const std::vector<std::pair<std::string, std::string>>& metadata = {});

/// The same bytes, handed to `sink` one tensor at a time as `fill` hands them (StorageStream:
/// tensor k is the k-th entry of `shapes`, whose tensors give only dtypes and shapes). Throws
/// std::logic_error when `fill` hands a tensor out of order, of another shape, or not at all.
void stream_safetensors(const StateDict& shapes, const StorageStream& fill, const ByteSink& sink);

/// Whether `bytes` start like a safetensors file (a sane header length, then '{').
bool looks_like_safetensors(const std::vector<char>& bytes);

/// Parses a .safetensors file; throws CheckpointError naming `source` and what is wrong
/// (truncated, bad header, overlapping or missing bytes, unknown dtype).
StateDict parse_safetensors(const std::vector<char>& bytes, const std::string& source);

}  // namespace dtorch::checkpoint
