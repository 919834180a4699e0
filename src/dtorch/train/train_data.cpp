// Each kind of data as two Splits. Image folders and CIFAR-10 share one path (an
// ImageSource through image_batch); MNIST keeps its normalised tensors so that runs stay
// bit-identical to the Python peer's.
#include "dtorch/train/train_data.h"

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/data/image_dataset.h"
#include "dtorch/data/mnist_dataset.h"
#include "dtorch/data/text_dataset.h"

namespace dtorch::train {
namespace {

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::string after_colon(const std::string& s) {
  return s.substr(s.find(':') + 1);
}

Split image_split(std::shared_ptr<const data::ImageSource> source,
                  const data::ImageBatchOptions& options) {
  return {source->size(), [source, options](const std::vector<int64_t>& idx, int64_t epoch) {
            auto b = data::image_batch(*source, idx, options, epoch);
            return std::make_pair(b.images, b.labels);
          }};
}

}  // namespace

TrainData open_data(const DataConfig& config, uint64_t seed) {
  const std::string& data = config.source;
  const LoaderConfig& loader = config.loader;
  TrainData d;
  if (is_text_data(data)) return d;
  if (!is_image_data(data)) {
    const std::string dir = config.dir.empty() ? data::kDefaultMnistDir : config.dir;
    // The sampler and the evaluation take the first N samples: the rest is never read.
    auto train =
        std::make_shared<data::MnistSplit>(data::load_mnist(dir, "train", config.train_samples));
    auto test =
        std::make_shared<data::MnistSplit>(data::load_mnist(dir, "test", config.test_samples));
    auto batch_of = [](std::shared_ptr<data::MnistSplit> s) {
      return [s](const std::vector<int64_t>& idx, int64_t) {
        auto b = data::gather(*s, idx);
        return std::make_pair(b.images, b.labels);
      };
    };
    d.train = {train->size(), batch_of(train)};
    d.test = {test->size(), batch_of(test)};
    d.describe = str(data, " (", dir, ")");
    return d;
  }
  const data::ImageSplits s = starts_with(data, "cifar10:")
                                  ? data::load_cifar10(after_colon(data))
                                  : data::scan_image_folder(after_colon(data));
  data::ImageBatchOptions o;
  o.transform.size = loader.image_size > 0 ? loader.image_size
                     : s.natural_size > 0  ? s.natural_size
                                           : 32;
  o.transform.pad = std::max<int64_t>(1, o.transform.size / 8);  // 4 at CIFAR's 32
  o.transform.mean = s.mean;
  o.transform.std = s.std;
  o.seed = seed;
  o.bad = loader.bad_images;
  data::ImageBatchOptions train_options = o;
  train_options.transform.augment = loader.augment != Augment::None;
  d.train = image_split(s.train, train_options);
  d.test = image_split(s.test, o);
  d.input = {3, o.transform.size, static_cast<int64_t>(s.classes.size())};
  d.describe =
      str(s.describe, " (", s.train->size(), " training and ", s.test->size(), " test images, ",
          s.classes.size(), " classes, ", o.transform.size, "x", o.transform.size,
          train_options.transform.augment ? ", random crop and flip" : "", ")");
  return d;
}

void add_text_windows(TrainData& d, const std::string& data, int64_t seq_len) {
  auto text = data::load_text(data == "text" ? "" : data.substr(5));
  auto parts = std::make_shared<data::TextSplits>(data::split_text(text));
  const int64_t T = seq_len;
  d.train = {data::num_windows(parts->train, T),
             [parts, T](const std::vector<int64_t>& idx, int64_t) {
               auto b = data::text_batch(parts->train, idx, T);
               return std::make_pair(b.inputs, b.targets);
             }};
  d.test = {data::num_windows(parts->val, T), [parts, T](const std::vector<int64_t>& idx, int64_t) {
              auto b = data::text_batch(parts->val, idx, T);
              return std::make_pair(b.inputs, b.targets);
            }};
  d.describe = str(text.source, " (", text.size(), " byte tokens, windows of ", T, ")");
}

}  // namespace dtorch::train
