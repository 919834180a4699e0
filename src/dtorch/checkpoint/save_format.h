// The file formats a state dict is written in. Apart from state_dict.h so that a run's plain
// settings (train/config/) name them without the model and tensor headers.
#pragma once

#include <string>

#include "dtorch/core/enum_names.h"

namespace dtorch::checkpoint {

/// The two file formats a state dict is written in: torch.save's (`.pt`) and safetensors
/// (named pt and safetensors).
enum class SaveFormat { Torch, Safetensors };
const NameTable<SaveFormat>& names(SaveFormat);
/// The usual file suffix: ".pt" or ".safetensors".
std::string file_suffix(SaveFormat format);

}  // namespace dtorch::checkpoint
