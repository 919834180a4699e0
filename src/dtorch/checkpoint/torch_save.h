// Files in torch.save's format that Python's torch.load reads as they are, including with
// weights_only=True, its default from PyTorch 2.6. See Note [Files torch.load reads].
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace dtorch::checkpoint {

/// The bytes torch.save would write for `value`: a zip archive of a pickle (protocol 2) and one
/// record per tensor storage. Dicts, lists, strings, numbers, None and CPU tensors only; a dict
/// becomes a plain Python dict (insertion order kept).
std::vector<char> torch_save_bytes(const c10::IValue& value);

/// Why `bytes` cannot be a whole zip archive, or "": its end-of-central-directory record (zip64's
/// too) must be there and its central directory inside the bytes. Checked before LibTorch's
/// reader sees the bytes: LibTorch 1.13's pickle_load reads outside the buffer of a truncated
/// archive (AddressSanitizer: heap-buffer-overflow in mz_zip_reader_init).
std::string zip_archive_problem(const std::vector<char>& bytes);

}  // namespace dtorch::checkpoint
