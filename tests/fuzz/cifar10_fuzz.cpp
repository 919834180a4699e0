// CIFAR-10's binary batch files as `--data cifar10:DIR` reads them: the input is
// data_batch_1.bin and test_batch.bin, beside four well-formed one-record batches; then every
// sample of both splits is loaded as a training batch would.
#include <cstdint>
#include <vector>

#include "dtorch/data/image_dataset.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(cifar10) {
  using namespace dtorch;
  static const std::string dir = [] {
    std::string d = paths::join(fuzz::scratch(), "cifar-10-batches-bin");
    paths::create_directories(d);
    std::vector<uint8_t> record(1 + 3 * 32 * 32, 7);
    record[0] = 3;
    for (int b = 2; b <= 5; ++b)
      fuzz::write_file(paths::join(d, "data_batch_" + std::to_string(b) + ".bin"), record.data(),
                       record.size());
    return d;
  }();
  fuzz::write_file(paths::join(dir, "data_batch_1.bin"), data, size);
  fuzz::write_file(paths::join(dir, "test_batch.bin"), data, size);
  return fuzz::accept_errors([&] {
    data::ImageSplits s = data::load_cifar10(fuzz::scratch());
    for (const auto& split : {s.train, s.test}) {
      for (int64_t i = 0; i < split->size(); ++i) {
        data::RgbImage image = split->load(i, 32);
        if (split->label(i) < 0 || split->label(i) >= static_cast<int64_t>(s.classes.size()) ||
            image.pixels.size() != static_cast<size_t>(image.width * image.height * 3))
          std::abort();  // a sample the loader accepted but cannot use
        (void)split->name(i);
      }
    }
  });
}
