// Tests for input files (core/input_file.h, Note [Input files]) and for the writer's refusal of
// paths that hold no file (core/atomic_file.h): what a directory, a FIFO, a device or a file
// over the limit gets, and that none of them blocks or is replaced.
#include "dtorch/core/input_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "dtorch/core/atomic_file.h"
#include "dtorch/core/paths.h"
#include "support/error_of.h"
#include "support/workers.h"

namespace dtorch {
namespace {

TEST(InputFile, OnlyRegularFilesWithinTheLimitAreRead) {
  const std::string dir = testing::scratch_dir("input-file");
  std::ofstream(dir + "/ten") << "0123456789";
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);

  std::string bytes, problem;
  ASSERT_TRUE(read_input_file(dir + "/ten", 10, &bytes, &problem)) << problem;
  EXPECT_EQ(bytes, "0123456789");
  EXPECT_FALSE(read_input_file(dir + "/ten", 9, &bytes, &problem));
  EXPECT_EQ(problem, "is 10 bytes, more than the 9 this reader takes");
  EXPECT_TRUE(bytes.empty());

  EXPECT_EQ(input_file_problem(dir + "/none"), "no such file");
  EXPECT_EQ(input_file_problem(dir), "is a directory, not a file to read");
  // A FIFO nobody writes to would block a plain open or read forever.
  EXPECT_EQ(input_file_problem(dir + "/fifo"), "is a FIFO (named pipe), not a file to read");
  // /dev/zero would be read until memory runs out.
  EXPECT_EQ(input_file_problem("/dev/zero"), "is a character device, not a file to read");
  EXPECT_EQ(without_locations(testing::error_of<DataError>(
                [] { read_input_file<DataError>("/dev/zero", "corpus"); })),
            "corpus /dev/zero: is a character device, not a file to read");
}

TEST(InputFile, TheWriterReplacesOnlyRegularFiles) {
  const std::string dir = testing::scratch_dir("output-file");
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  paths::create_directory(dir + "/folder");
  for (const std::string name : {"fifo", "folder"}) {
    const auto why = write_file_atomically(dir + "/" + name, "x", 1);
    ASSERT_TRUE(why.has_value()) << name;
    EXPECT_NE(why->find("dtorch replaces only regular files"), std::string::npos) << *why;
  }
  EXPECT_EQ(paths::kind(dir + "/fifo"), "a FIFO (named pipe)") << "left in place";
  EXPECT_EQ(paths::kind(dir + "/folder"), "a directory");
  EXPECT_FALSE(write_file_atomically(dir + "/file", "x", 1).has_value());
  EXPECT_FALSE(write_file_atomically(dir + "/file", "yz", 2).has_value()) << "a file is replaced";
  EXPECT_EQ(paths::file_size(dir + "/file"), 2u);
}

}  // namespace
}  // namespace dtorch
