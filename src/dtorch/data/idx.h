// Reader for IDX files, the format MNIST and Fashion-MNIST ship in, gzipped or raw.
// LibTorch's own MNIST reader wants raw files with exactly 60000/10000 samples; this one does not.
#pragma once

#include <torch/types.h>

#include <string>

namespace dtorch::data {

/// Reads the IDX file at `path` (gzip-compressed or raw, told apart by content) and returns
/// its data as a uint8 tensor shaped by the header's dimensions, e.g. N x 28 x 28 for images.
/// Only unsigned-byte files (type 0x08) are supported, which is every MNIST-style dataset.
/// Throws DataError naming the file when it is missing, unreadable, truncated, has trailing
/// bytes, a bad magic number, or an element type other than unsigned byte.
///
/// With `max_items` >= 0 only the first `max_items` entries of the first dimension are read
/// (all of them where the file holds fewer), and the tensor's first dimension is what was read:
/// a run on the first N samples inflates and holds N, not the file's 60000. The bytes after
/// them are then neither read nor checked. `items_in_file`, where given, gets the count the
/// header announces.
torch::Tensor read_idx(const std::string& path, int64_t max_items = -1,
                       int64_t* items_in_file = nullptr);

}  // namespace dtorch::data
