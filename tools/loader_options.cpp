// The flags of train::LoaderConfig, declared once for every command that loads training data
// (`dtorch train`, `dtorch bench data`): one option group, so both read and show the same.
#include "dtorch/train/train_data.h"
#include "tools/commands.h"

namespace dtorch::tools {

void add_loader_options(CLI::App* cmd, train::LoaderConfig& l) {
  auto* g = cmd->add_option_group("Data loading", "how batches are made");
  g->add_option("--data-workers", l.workers,
                "threads that decode and prepare the next batches while one trains (0: the "
                "training thread prepares each batch)")
      ->capture_default_str();
  g->add_option("--image-size", l.image_size,
                "cifar10 and imagefolder: side of the square images the model takes; images "
                "are resized (shorter side) and centre-cropped to it (0: 32)")
      ->capture_default_str();
  g->add_option("--augment", l.augment,
                "auto | crop-flip (random crop with padding and horizontal flip while "
                "training) | none; auto: crop-flip for cifar10 and imagefolder, none for MNIST")
      ->check(CLI::IsMember({"auto", "crop-flip", "none"}))
      ->capture_default_str();
  g->add_option("--bad-images", l.bad_images,
                "fail | skip: an unreadable or truncated image stops the run naming the file, "
                "or is left out of its batch with a warning")
      ->check(CLI::IsMember({"fail", "skip"}))
      ->capture_default_str();
}

}  // namespace dtorch::tools
