// Text corpora (`--data text:PATH`, language models): the input is the file; it is read, split
// into training and validation tokens and cut into windows as a training batch is.
#include <cstdint>
#include <vector>

#include "dtorch/data/text_dataset.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(text) {
  using namespace dtorch;
  static const std::string path = paths::join(fuzz::scratch(), "corpus.txt");
  fuzz::write_file(path, data, size);
  return fuzz::accept_errors([&] {
    data::TextData text = data::load_text(path);
    if (text.size() != static_cast<int64_t>(size)) std::abort();  // a byte lost or invented
    data::TextSplits s = data::split_text(text, 0.1);
    const int64_t seq_len = 8;
    const int64_t n = data::num_windows(s.train, seq_len);
    std::vector<int64_t> windows{0, n - 1, n / 2};
    data::TextBatch b = data::text_batch(s.train, windows, seq_len);
    if (b.inputs.size(0) != 3 || b.targets.size(1) != seq_len) std::abort();
  });
}
