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
torch::Tensor read_idx(const std::string& path);

}  // namespace dtorch::data
