// A sharded checkpoint's names (Note [Sharded checkpoint format] in sharded_checkpoint.h): its
// files and step folders, and the dtype names metadata.json uses; the save
// (sharded_checkpoint.cpp) and the reader (sharded_checkpoint_reader.cpp) share them.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace dtorch::checkpoint {

inline const std::string kFormat = "dtorch-sharded-checkpoint";
inline const std::string kStepPrefix = "step-";
inline const std::string kPartial = ".partial";
inline const std::string kMetadata = "metadata.json";
inline const std::string kFullFile = "full.pt";

/// "shard-<rank>-of-<world>.pt", both numbers in five digits.
std::string shard_file(int rank, int world);

// The step of a step directory name, or -1 for any other name (staging folders included).
int64_t step_of(const std::string& name);

// Python's names, so metadata.json reads the same as torch's dtype attributes.
std::string dtype_name(torch::Dtype d);
/// std::nullopt for a name that is none of them.
std::optional<torch::Dtype> dtype_from_name(const std::string& s);

}  // namespace dtorch::checkpoint
