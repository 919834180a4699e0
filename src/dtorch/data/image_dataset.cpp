// Scanning folders, reading CIFAR-10's records and assembling batches. Everything here may
// run on several loader threads at once: sources are immutable after construction.
#include "dtorch/data/image_dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"

namespace dtorch::data {
namespace fs = std::filesystem;
namespace {

class FileSource : public ImageSource {
 public:
  void add(std::string path, int64_t label) {
    paths_.push_back(std::move(path));
    labels_.push_back(label);
  }
  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  int64_t label(int64_t i) const override { return labels_[static_cast<size_t>(i)]; }
  RgbImage load(int64_t i, int64_t min_side) const override {
    return decode_image_file(paths_[static_cast<size_t>(i)], min_side);
  }
  std::string name(int64_t i) const override { return paths_[static_cast<size_t>(i)]; }

 private:
  std::vector<std::string> paths_;
  std::vector<int64_t> labels_;
};

bool hidden(const fs::path& p) {
  return p.filename().string().rfind('.', 0) == 0;
}

// Sorted visible sub-folders of `dir`.
std::vector<std::string> class_folders(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec) && !hidden(e.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Image files under `folder` (recursively, as ImageFolder does), in path order.
std::vector<std::string> image_files(const fs::path& folder) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(folder, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (hidden(it->path())) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec) && is_image_file(it->path().string()))
      files.push_back(it->path().string());
  }
  DTORCH_CHECK_T(DataError, !ec, "cannot list ", folder.string(), ": ", ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> checked_classes(const fs::path& dir) {
  auto classes = class_folders(dir);
  DTORCH_CHECK_T(DataError, classes.size() >= 2, dir.string(), " has ", classes.size(),
                 " class folder(s): an image folder needs one sub-folder per class, at least "
                 "two (DIR/cat/1.jpg, DIR/dog/2.png, ...), or DIR/train and DIR/val holding "
                 "such folders");
  return classes;
}

std::vector<std::string> files_of_class(const fs::path& dir, const std::string& cls) {
  auto files = image_files(dir / cls);
  DTORCH_CHECK_T(DataError, !files.empty(), (dir / cls).string(),
                 " holds no .jpg, .jpeg or .png file: add images, or remove the folder so it "
                 "is not a class");
  return files;
}

}  // namespace

ImageSplits scan_image_folder(const std::string& dir) {
  std::error_code ec;
  DTORCH_CHECK_T(DataError, fs::is_directory(dir, ec), "image folder ", dir,
                 " does not exist or is not a directory (--data imagefolder:DIR)");
  ImageSplits s;
  s.mean = kImageNetMean;
  s.std = kImageNetStd;
  auto train = std::make_shared<FileSource>();
  auto test = std::make_shared<FileSource>();
  const fs::path root(dir);
  fs::path held_out;
  for (const char* name : {"val", "test"})
    if (held_out.empty() && fs::is_directory(root / name, ec)) held_out = root / name;
  if (fs::is_directory(root / "train", ec) && !held_out.empty()) {
    s.classes = checked_classes(root / "train");
    for (size_t c = 0; c < s.classes.size(); ++c)
      for (auto& f : files_of_class(root / "train", s.classes[c]))
        train->add(std::move(f), static_cast<int64_t>(c));
    for (const auto& cls : class_folders(held_out)) {
      auto it = std::find(s.classes.begin(), s.classes.end(), cls);
      DTORCH_CHECK_T(DataError, it != s.classes.end(), (held_out / cls).string(),
                     " is a class the training split ", (root / "train").string(),
                     " lacks: the two must name the same classes");
      for (auto& f : image_files(held_out / cls))
        test->add(std::move(f), it - s.classes.begin());
    }
    s.describe = str((root / "train").string(), " and ", held_out.string());
  } else {
    s.classes = checked_classes(root);
    for (size_t c = 0; c < s.classes.size(); ++c) {
      auto files = files_of_class(root, s.classes[c]);
      for (size_t i = 0; i < files.size(); ++i)
        (i % 10 == 9 ? test : train)->add(std::move(files[i]), static_cast<int64_t>(c));
    }
    s.describe = str(dir, ", every tenth image of each class held out for testing");
  }
  DTORCH_CHECK_T(DataError, test->size() > 0, "image folder ", dir,
                 " leaves no image for testing: give each class 10 or more images, or add "
                 "DIR/val with class folders");
  s.train = train;
  s.test = test;
  return s;
}

namespace {

constexpr int64_t kCifarSide = 32;
constexpr int64_t kCifarRecord = 1 + 3 * kCifarSide * kCifarSide;

class CifarSource : public ImageSource {
 public:
  void read(const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    DTORCH_CHECK_T(DataError, in.good(), file.string(),
                   " is missing or unreadable: --data cifar10:DIR expects CIFAR-10's binary "
                   "version (data_batch_1.bin ... data_batch_5.bin, test_batch.bin) in DIR");
    // Read straight onto the end of records_: one copy of the data set in memory, not two.
    std::error_code ec;
    const auto size = fs::file_size(file, ec);
    DTORCH_CHECK_T(DataError, !ec && size > 0 && size % kCifarRecord == 0, file.string(), " holds ",
                   ec ? 0 : size, " bytes, not a whole number of ", kCifarRecord,
                   "-byte CIFAR-10 records (truncated download?)");
    const std::size_t at = records_.size();
    records_.resize(at + size);
    in.read(reinterpret_cast<char*>(records_.data() + at), static_cast<std::streamsize>(size));
    DTORCH_CHECK_T(DataError, static_cast<std::size_t>(in.gcount()) == size, file.string(),
                   ": read ", in.gcount(), " of its ", size, " bytes");
    const int64_t n = static_cast<int64_t>(size) / kCifarRecord;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t label = records_[at + static_cast<size_t>(i * kCifarRecord)];
      DTORCH_CHECK_T(DataError, label < 10, file.string(), " record ", i, " has label ", int(label),
                     " (CIFAR-10 has 0..9): is it CIFAR-100's file?");
      files_.push_back({file.filename().string(), i});
    }
  }
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  int64_t label(int64_t i) const override {
    return records_[static_cast<size_t>(i * kCifarRecord)];
  }
  RgbImage load(int64_t i, int64_t) const override {
    const uint8_t* planes = records_.data() + i * kCifarRecord + 1;
    const int64_t area = kCifarSide * kCifarSide;
    RgbImage image;
    image.width = image.height = kCifarSide;
    image.pixels.resize(static_cast<size_t>(area * 3));
    for (int64_t p = 0; p < area; ++p)
      for (int64_t c = 0; c < 3; ++c)
        image.pixels[static_cast<size_t>(p * 3 + c)] = planes[c * area + p];
    return image;
  }
  std::string name(int64_t i) const override {
    const auto& f = files_[static_cast<size_t>(i)];
    return str(f.first, " record ", f.second);
  }

 private:
  std::vector<uint8_t> records_;
  std::vector<std::pair<std::string, int64_t>> files_;
};

}  // namespace

ImageSplits load_cifar10(const std::string& dir) {
  std::error_code ec;
  fs::path root(dir);
  if (fs::is_directory(root / "cifar-10-batches-bin", ec)) root /= "cifar-10-batches-bin";
  DTORCH_CHECK_T(DataError, fs::is_directory(root, ec), "CIFAR-10 folder ", dir,
                 " does not exist (--data cifar10:DIR, DIR holding data_batch_1.bin ...)");
  auto train = std::make_shared<CifarSource>();
  for (int b = 1; b <= 5; ++b)
    train->read(root / str("data_batch_", b, ".bin"));
  auto test = std::make_shared<CifarSource>();
  test->read(root / "test_batch.bin");
  ImageSplits s;
  s.classes = {"airplane", "automobile", "bird",  "cat",  "deer",
               "dog",      "frog",       "horse", "ship", "truck"};
  s.train = train;
  s.test = test;
  s.mean = kCifar10Mean;
  s.std = kCifar10Std;
  s.natural_size = kCifarSide;
  s.describe = root.string();
  return s;
}

ImageBatch image_batch(const ImageSource& source, const std::vector<int64_t>& indices,
                       const ImageBatchOptions& o, int64_t epoch) {
  const int64_t S = o.transform.size;
  ImageBatch b;
  b.images = torch::empty({static_cast<int64_t>(indices.size()), 3, S, S});
  std::vector<int64_t> labels;
  float* out = b.images.data_ptr<float>();
  for (int64_t i : indices) {
    RgbImage image;
    try {
      image = source.load(i, S);
    } catch (const DataError& e) {
      if (o.bad == BadImages::Fail) {
        throw DataError(
            str(e.what(), "; to train on without unreadable images, add ", "--bad-images skip"));
      }
      static std::mutex mutex;
      static std::set<std::string> warned;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (warned.insert(source.name(i)).second)
          log::warn("skipping ", e.what(), " (--bad-images skip)");
      }
      b.skipped.push_back(e.what());
      continue;
    }
    transform_image(image, o.transform, sample_seed(o.seed, epoch, i), out);
    out += 3 * S * S;
    labels.push_back(source.label(i));
  }
  DTORCH_CHECK_T(DataError, !labels.empty(), "every image of a batch was unreadable (",
                 b.skipped.empty() ? std::string("empty batch") : b.skipped.front(),
                 ", ...): check the data folder");
  b.images = b.images.narrow(0, 0, static_cast<int64_t>(labels.size()));
  b.labels = torch::tensor(labels, torch::kLong);
  return b;
}

}  // namespace dtorch::data
