// What `dtorch train` trains on: --data names MNIST-format files, CIFAR-10, an image folder or
// a text, and this file turns each into the same two splits of (inputs, targets) batches.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dtorch/data/image_dataset.h"
#include "dtorch/models/model.h"
#include "dtorch/train/config/run_config.h"

namespace dtorch::train {

/// One split: `size` samples (images or text windows) and the batch of inputs and targets
/// for any list of sample indices in a given epoch (augmentation differs per epoch). batch
/// may be called from several threads at once.
struct Split {
  int64_t size = 0;
  std::function<std::pair<torch::Tensor, torch::Tensor>(const std::vector<int64_t>&, int64_t)>
      batch;
};

struct TrainData {
  Split train, test;
  models::ImageInput input;  ///< what an image model is to be built for
  std::string describe;      ///< for the log: what was read from where
};

/// Reads `data.source` (MNIST from `data.dir`, empty: Debian's folder; of MNIST only the first
/// train_samples and test_samples where set), and for image data decides the model's input; a
/// text is only read by add_text_windows, once the model's sequence length is known. `seed`
/// makes the augmentation's choices.
TrainData open_data(const DataConfig& data, uint64_t seed);

/// Fills `d`'s splits with windows of `seq_len` tokens of the text `data` names.
void add_text_windows(TrainData& d, const std::string& data, int64_t seq_len);

}  // namespace dtorch::train
