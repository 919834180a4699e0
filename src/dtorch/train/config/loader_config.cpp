// The data's settings (loader_config.h): the names of --augment, the kinds of --data and their
// validation.
#include "dtorch/train/config/loader_config.h"

#include "dtorch/core/error.h"

namespace dtorch::train {
inline namespace config {
namespace {

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace

const NameTable<Augment>& names(Augment) {
  static const NameTable<Augment> n{
      {Augment::Auto, "auto"}, {Augment::CropFlip, "crop-flip"}, {Augment::None, "none"}};
  return n;
}

bool is_text_data(const std::string& data) {
  return data == "text" || starts_with(data, "text:");
}

bool is_image_data(const std::string& data) {
  return starts_with(data, "cifar10:") || starts_with(data, "imagefolder:");
}

void validate_data(const std::string& data, const LoaderConfig& l, bool language_model) {
  const bool mnist = data == "fashion-mnist" || data == "mnist";
  DTORCH_CHECK_T(ConfigError, mnist || is_text_data(data) || is_image_data(data), "unknown data '",
                 data,
                 "'; use fashion-mnist or mnist (IDX files, see --data-dir), cifar10:DIR "
                 "(CIFAR-10's binary files), imagefolder:DIR (one sub-folder per class), or "
                 "text[:PATH] for language models");
  DTORCH_CHECK_T(ConfigError, !is_image_data(data) || data.size() > data.find(':') + 1, "--data ",
                 data, " names no folder: give it after the colon (", data, "/path/to/folder)");
  DTORCH_CHECK_T(ConfigError, language_model == is_text_data(data), "--data ", data,
                 language_model
                     ? " is images and the model is a language model: use --data text or "
                       "text:PATH"
                     : " is text and the model classifies images: use --data fashion-mnist, "
                       "cifar10:DIR or imagefolder:DIR");
  DTORCH_CHECK_T(ConfigError, l.workers >= 0 && l.workers <= 64, "--data-workers ", l.workers,
                 ": give 0 (build batches on the training thread) to 64");
  DTORCH_CHECK_T(ConfigError, l.image_size >= 0 && l.image_size <= 4096, "--image-size ",
                 l.image_size, ": give a side in pixels (1 to 4096), or 0 for the data's own");
  if (mnist) {
    DTORCH_CHECK_T(ConfigError, l.image_size == 0 || l.image_size == 28, "--image-size ",
                   l.image_size, " with ", data,
                   ": MNIST images are 28x28 and are not resized; leave --image-size out");
    DTORCH_CHECK_T(ConfigError, l.augment != Augment::CropFlip, "--augment crop-flip applies to ",
                   "cifar10:DIR and imagefolder:DIR data; ", data, " trains unaugmented, as the ",
                   "Python peer does");
  }
}

}  // namespace config
}  // namespace dtorch::train
