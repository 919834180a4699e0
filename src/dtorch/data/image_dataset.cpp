// Scanning folders, reading CIFAR-10's records and assembling batches. Everything here may
// run on several loader threads at once: sources are immutable after construction.
#include "dtorch/data/image_dataset.h"

#include <algorithm>
#include <fstream>
#include <mutex>
#include <set>

#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"

namespace dtorch::data {

const NameTable<BadImages>& names(BadImages) {
  static const NameTable<BadImages> n{{BadImages::Fail, "fail"}, {BadImages::Skip, "skip"}};
  return n;
}

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

bool hidden(const std::string& name) {
  return name.rfind('.', 0) == 0;
}

// Sorted visible sub-folders of `dir`.
std::vector<std::string> class_folders(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::string& name : paths::list_directory(dir, ec))  // sorted
    if (!hidden(name) && paths::is_directory(paths::join(dir, name))) names.push_back(name);
  return names;
}

// Image files under `folder` (recursively, as ImageFolder does, skipping hidden files and
// folders and not following symlinked folders), in path order.
std::vector<std::string> image_files(const std::string& folder) {
  std::vector<std::string> files;
  std::error_code ec;
  for (std::string& f : paths::list_files_recursively(folder, ec, hidden))  // sorted
    if (is_image_file(f)) files.push_back(std::move(f));
  DTORCH_CHECK_T(DataError, !ec, "cannot list ", folder, ": ", ec.message());
  return files;
}

std::vector<std::string> checked_classes(const std::string& dir) {
  auto classes = class_folders(dir);
  DTORCH_CHECK_T(DataError, classes.size() >= 2, dir, " has ", classes.size(),
                 " class folder(s): an image folder needs one sub-folder per class, at least "
                 "two (DIR/cat/1.jpg, DIR/dog/2.png, ...), or DIR/train and DIR/val holding "
                 "such folders");
  return classes;
}

std::vector<std::string> files_of_class(const std::string& dir, const std::string& cls) {
  auto files = image_files(paths::join(dir, cls));
  DTORCH_CHECK_T(DataError, !files.empty(), paths::join(dir, cls),
                 " holds no .jpg, .jpeg or .png file: add images, or remove the folder so it "
                 "is not a class");
  return files;
}

}  // namespace

ImageSplits scan_image_folder(const std::string& dir) {
  DTORCH_CHECK_T(DataError, paths::is_directory(dir), "image folder ", dir,
                 " does not exist or is not a directory (--data imagefolder:DIR)");
  ImageSplits s;
  s.mean = kImageNetMean;
  s.std = kImageNetStd;
  auto train = std::make_shared<FileSource>();
  auto test = std::make_shared<FileSource>();
  const std::string train_dir = paths::join(dir, "train");
  std::string held_out;
  for (const char* name : {"val", "test"})
    if (held_out.empty() && paths::is_directory(paths::join(dir, name)))
      held_out = paths::join(dir, name);
  if (paths::is_directory(train_dir) && !held_out.empty()) {
    s.classes = checked_classes(train_dir);
    for (size_t c = 0; c < s.classes.size(); ++c)
      for (auto& f : files_of_class(train_dir, s.classes[c]))
        train->add(std::move(f), static_cast<int64_t>(c));
    for (const auto& cls : class_folders(held_out)) {
      auto it = std::find(s.classes.begin(), s.classes.end(), cls);
      DTORCH_CHECK_T(DataError, it != s.classes.end(), paths::join(held_out, cls),
                     " is a class the training split ", train_dir,
                     " lacks: the two must name the same classes");
      for (auto& f : image_files(paths::join(held_out, cls)))
        test->add(std::move(f), it - s.classes.begin());
    }
    s.describe = str(train_dir, " and ", held_out);
  } else {
    s.classes = checked_classes(dir);
    for (size_t c = 0; c < s.classes.size(); ++c) {
      auto files = files_of_class(dir, s.classes[c]);
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
  void read(const std::string& file) {
    const std::string problem = input_file_problem(file);
    DTORCH_CHECK_T(DataError, problem.empty(), file, ": ", problem,
                   "; --data cifar10:DIR expects CIFAR-10's binary version (data_batch_1.bin ... "
                   "data_batch_5.bin, test_batch.bin) in DIR");
    std::ifstream in(file, std::ios::binary);
    // Read straight onto the end of records_: one copy of the data set in memory, not two.
    std::error_code ec;
    const uint64_t size = paths::file_size(file, ec);  // 0 when unreadable
    DTORCH_CHECK_T(DataError, !ec && size > 0 && size % kCifarRecord == 0, file, " holds ", size,
                   " bytes, not a whole number of ", kCifarRecord,
                   "-byte CIFAR-10 records (truncated download?)");
    const std::size_t at = records_.size();
    records_.resize(at + size);
    in.read(reinterpret_cast<char*>(records_.data() + at), static_cast<std::streamsize>(size));
    DTORCH_CHECK_T(DataError, static_cast<std::size_t>(in.gcount()) == size, file, ": read ",
                   in.gcount(), " of its ", size, " bytes");
    const int64_t n = static_cast<int64_t>(size) / kCifarRecord;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t label = records_[at + static_cast<size_t>(i * kCifarRecord)];
      DTORCH_CHECK_T(DataError, label < 10, file, " record ", i, " has label ", int(label),
                     " (CIFAR-10 has 0..9): is it CIFAR-100's file?");
      files_.push_back({paths::file_name(file), i});
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
  std::string root = dir;
  if (paths::is_directory(paths::join(root, "cifar-10-batches-bin")))
    root = paths::join(root, "cifar-10-batches-bin");
  DTORCH_CHECK_T(DataError, paths::is_directory(root), "CIFAR-10 folder ", dir,
                 " does not exist (--data cifar10:DIR, DIR holding data_batch_1.bin ...)");
  auto train = std::make_shared<CifarSource>();
  for (int b = 1; b <= 5; ++b)
    train->read(paths::join(root, str("data_batch_", b, ".bin")));
  auto test = std::make_shared<CifarSource>();
  test->read(paths::join(root, "test_batch.bin"));
  ImageSplits s;
  s.classes = {"airplane", "automobile", "bird",  "cat",  "deer",
               "dog",      "frog",       "horse", "ship", "truck"};
  s.train = train;
  s.test = test;
  s.mean = kCifar10Mean;
  s.std = kCifar10Std;
  s.natural_size = kCifarSide;
  s.describe = root;
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
