// IDX files (MNIST, Fashion-MNIST; raw or gzipped) as `dtorch train --data-dir` reads them:
// the input is the file, read_idx the reader.
#include <cstdint>

#include "dtorch/data/idx.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(idx) {
  using namespace dtorch;
  static const std::string path = paths::join(fuzz::scratch(), "images-idx3-ubyte");
  fuzz::write_file(path, data, size);
  return fuzz::accept_errors([&] {
    torch::Tensor t = data::read_idx(path);
    if (t.numel() > 0) (void)t.sum().item<int64_t>();  // every byte it claims is readable
  });
}
