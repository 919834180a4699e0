// Tests for paths.h: the name operations against std::filesystem::path's answers (written out,
// as no dtorch binary may link std::filesystem), and the file system operations on real trees.
#include "dtorch/core/paths.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "dtorch/core/error.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::paths {
namespace {

void paths_test_write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

using Names = std::vector<std::string>;

TEST(PathNames, MatchStdFilesystemPath) {
  // {path, parent_path, file_name, extension, lexically_normal}, as libstdc++'s
  // std::filesystem::path gives them.
  const std::vector<std::vector<std::string>> table = {
      {"", "", "", "", ""},
      {"/", "/", "", "", "/"},
      {"a", "", "a", "", "a"},
      {"a/", "a", "", "", "a/"},
      {"/a", "/", "a", "", "/a"},
      {"//a", "/", "a", "", "/a"},
      {"a/b", "a", "b", "", "a/b"},
      {"a/b/", "a/b", "", "", "a/b/"},
      {"a//b//", "a//b", "", "", "a/b/"},
      {"a/b/c.tar.gz", "a/b", "c.tar.gz", ".gz", "a/b/c.tar.gz"},
      {".", "", ".", "", "."},
      {"..", "", "..", "", ".."},
      {"./", ".", "", "", "."},
      {"../", "..", "", "", ".."},
      {"a/.", "a", ".", "", "a/"},
      {"a/..", "a", "..", "", "."},
      {"a/b/..", "a/b", "..", "", "a/"},
      {"/..", "/", "..", "", "/"},
      {"/../a", "/..", "a", "", "/a"},
      {"../..", "..", "..", "", "../.."},
      {"a/../../b", "a/../..", "b", "", "../b"},
      {"foo/./bar/..", "foo/./bar", "..", "", "foo/"},
      {"x/.png", "x", ".png", "", "x/.png"},
      {"x/..png", "x", "..png", ".png", "x/..png"},
      {"x/y.", "x", "y.", ".", "x/y."},
      {"runs//x/../y/", "runs//x/../y", "", "", "runs/y/"},
      {"/a/b/../../..", "/a/b/../..", "..", "", "/"},
  };
  for (const auto& row : table) {
    EXPECT_EQ(parent_path(row[0]), row[1]) << row[0];
    EXPECT_EQ(file_name(row[0]), row[2]) << row[0];
    EXPECT_EQ(extension(row[0]), row[3]) << row[0];
    EXPECT_EQ(lexically_normal(row[0]), row[4]) << row[0];
  }
}

TEST(PathNames, JoinAddsOneSeparator) {
  EXPECT_EQ(join("a", "b"), "a/b");
  EXPECT_EQ(join("a/", "b"), "a/b");
  EXPECT_EQ(join("", "b"), "b");
  EXPECT_EQ(join("a", "/b"), "/b");  // an absolute second part replaces the first
  EXPECT_EQ(join("a", ""), "a/");
  EXPECT_EQ(join("/", "x"), "/x");
  EXPECT_EQ(join("a", "b", "c.pt"), "a/b/c.pt");
}

TEST(PathQueries, KindsSizesAndListings) {
  const std::string dir = testing::scratch_dir("paths-queries");
  paths_test_write(dir + "/f", "12345");
  paths_test_write(dir + "/empty", "");
  create_directory(dir + "/sub");
  create_symlink("f", dir + "/link");
  create_symlink("nowhere", dir + "/dangling");

  EXPECT_TRUE(exists(dir + "/f"));
  EXPECT_TRUE(exists(dir + "/link"));
  EXPECT_FALSE(exists(dir + "/dangling"));  // a symlink counts as what it points to
  EXPECT_FALSE(exists(dir + "/absent"));
  EXPECT_FALSE(exists(""));
  EXPECT_TRUE(is_directory(dir + "/sub"));
  EXPECT_FALSE(is_directory(dir + "/f"));
  EXPECT_TRUE(is_regular_file(dir + "/link"));
  EXPECT_FALSE(is_regular_file(dir + "/sub"));
  EXPECT_TRUE(is_symlink(dir + "/link"));
  EXPECT_TRUE(is_symlink(dir + "/dangling"));
  EXPECT_FALSE(is_symlink(dir + "/f"));
  EXPECT_TRUE(is_empty(dir + "/sub"));
  EXPECT_TRUE(is_empty(dir + "/empty"));
  EXPECT_FALSE(is_empty(dir + "/f"));
  EXPECT_FALSE(is_empty(dir));
  EXPECT_FALSE(is_empty(dir + "/absent"));

  std::error_code ec;
  EXPECT_EQ(file_size(dir + "/f", ec), 5u);
  EXPECT_FALSE(ec);
  EXPECT_EQ(file_size(dir + "/absent", ec), 0u);
  EXPECT_EQ(ec, std::errc::no_such_file_or_directory);
  file_size(dir + "/sub", ec);
  EXPECT_EQ(ec, std::errc::is_a_directory);
  EXPECT_THROW(file_size(dir + "/absent"), Error);

  EXPECT_EQ(read_symlink(dir + "/link", ec), "f");
  EXPECT_FALSE(ec);
  EXPECT_EQ(read_symlink(dir + "/f", ec), "");
  EXPECT_EQ(ec, std::errc::invalid_argument);
  EXPECT_EQ(canonical(dir + "/sub/../link", ec), canonical(dir, ec) + "/f");
  EXPECT_EQ(canonical(dir + "/absent", ec), "");
  EXPECT_TRUE(ec);

  EXPECT_EQ(list_directory(dir, ec), (Names{"dangling", "empty", "f", "link", "sub"}));
  EXPECT_FALSE(ec);
  EXPECT_EQ(list_directory(dir + "/sub", ec), Names{});
  EXPECT_FALSE(ec);
  EXPECT_EQ(list_directory(dir + "/absent", ec), Names{});
  EXPECT_EQ(ec, std::errc::no_such_file_or_directory);
  EXPECT_EQ(list_directory(dir + "/f", ec), Names{});
  EXPECT_EQ(ec, std::errc::not_a_directory);
  try {
    list_directory(dir + "/absent");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(testing::contains(e.what(), dir + "/absent")) << e.what();
  }
}

TEST(PathQueries, ExecutablePathIsThisProgram) {
  std::error_code ec;
  EXPECT_EQ(executable_path(), canonical("/proc/self/exe", ec));
}

TEST(PathQueries, RecursiveListingIsSortedAndStaysInsideTheTree) {
  const std::string root = testing::scratch_dir("paths-tree");
  const std::string outside = testing::scratch_dir("paths-tree-outside");
  paths_test_write(outside + "/o", "o");
  create_directories(root + "/b/x");
  create_directories(root + "/.hidden");
  paths_test_write(root + "/b/x/deep", "d");
  paths_test_write(root + "/b/f", "f");
  paths_test_write(root + "/b-c", "c");
  paths_test_write(root + "/.hidden/h", "h");
  paths_test_write(root + "/.dot", "d");
  create_symlink(outside, root + "/out-dir");          // not descended into
  create_symlink(outside + "/o", root + "/out-file");  // a file, listed

  std::error_code ec;
  // Whole paths in order: "b-c" sorts before "b/..." ('-' < '/').
  EXPECT_EQ(list_files_recursively(root, ec),
            (Names{root + "/.dot", root + "/.hidden/h", root + "/b-c", root + "/b/f",
                   root + "/b/x/deep", root + "/out-file"}));
  EXPECT_FALSE(ec);
  auto hidden = [](const std::string& name) { return name[0] == '.'; };
  EXPECT_EQ(list_files_recursively(root + "/", ec, hidden),
            (Names{root + "/b-c", root + "/b/f", root + "/b/x/deep", root + "/out-file"}));
  EXPECT_EQ(list_files_recursively(root + "/absent", ec), Names{});
  EXPECT_EQ(ec, std::errc::no_such_file_or_directory);

  // An unreadable sub-folder stops the listing with its error (root ignores permissions).
  if (::geteuid() != 0) {
    ASSERT_EQ(::chmod((root + "/b/x").c_str(), 0), 0);
    list_files_recursively(root, ec);
    EXPECT_EQ(ec, std::errc::permission_denied);
    ::chmod((root + "/b/x").c_str(), 0755);
  }
}

TEST(PathChanges, CreateDirectories) {
  const std::string dir = testing::scratch_dir("paths-create");
  std::error_code ec;
  EXPECT_TRUE(create_directories(dir + "/a/b/c/", ec));
  EXPECT_FALSE(ec);
  EXPECT_TRUE(is_directory(dir + "/a/b/c"));
  EXPECT_FALSE(create_directories(dir + "/a/b", ec));  // already there: no error
  EXPECT_FALSE(ec);
  EXPECT_FALSE(create_directory(dir + "/a", ec));
  EXPECT_FALSE(ec);
  EXPECT_TRUE(create_directory(dir + "/d", ec));

  paths_test_write(dir + "/file", "x");
  EXPECT_FALSE(create_directories(dir + "/file", ec));
  EXPECT_EQ(ec, std::errc::not_a_directory);
  EXPECT_FALSE(create_directories(dir + "/file/sub", ec));
  EXPECT_TRUE(ec);
  EXPECT_FALSE(create_directory(dir + "/file", ec));
  EXPECT_EQ(ec, std::errc::file_exists);
  EXPECT_FALSE(create_directory(dir + "/none/sub", ec));
  EXPECT_EQ(ec, std::errc::no_such_file_or_directory);
  EXPECT_FALSE(create_directories("", ec));
  EXPECT_EQ(ec, std::errc::invalid_argument);
  try {
    create_directories(dir + "/file/sub");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(testing::contains(e.what(), "cannot create directory " + dir + "/file/sub"))
        << e.what();
  }
}

TEST(PathChanges, RemoveAndRename) {
  const std::string dir = testing::scratch_dir("paths-remove");
  paths_test_write(dir + "/f", "x");
  create_directories(dir + "/full/sub");
  std::error_code ec;
  EXPECT_TRUE(remove(dir + "/f", ec));
  EXPECT_FALSE(exists(dir + "/f"));
  EXPECT_FALSE(remove(dir + "/f", ec));  // nothing there: no error
  EXPECT_FALSE(ec);
  EXPECT_FALSE(remove(dir + "/full", ec));
  EXPECT_EQ(ec, std::errc::directory_not_empty);
  EXPECT_THROW(remove(dir + "/full"), Error);
  EXPECT_TRUE(remove(dir + "/full/sub", ec));

  paths_test_write(dir + "/a", "a");
  paths_test_write(dir + "/b", "b");
  rename(dir + "/a", dir + "/b", ec);  // replaces b
  EXPECT_FALSE(ec);
  EXPECT_FALSE(exists(dir + "/a"));
  EXPECT_EQ(testing::read_file(dir + "/b"), "a");
  rename(dir + "/a", dir + "/c", ec);
  EXPECT_EQ(ec, std::errc::no_such_file_or_directory);
  EXPECT_THROW(rename(dir + "/a", dir + "/c"), Error);
}

TEST(PathChanges, RemoveAllDoesNotFollowSymlinks) {
  const std::string dir = testing::scratch_dir("paths-remove-all");
  const std::string keep = testing::scratch_dir("paths-remove-all-keep");
  paths_test_write(keep + "/precious", "p");
  create_directories(dir + "/t/a/b");
  paths_test_write(dir + "/t/a/b/f", "f");
  paths_test_write(dir + "/t/g", "g");
  create_symlink(keep, dir + "/t/a/to-dir");
  create_symlink(keep + "/precious", dir + "/t/to-file");
  create_symlink("nowhere", dir + "/t/dangling");

  std::error_code ec;
  // t, a, b, f, g and the three links.
  EXPECT_EQ(remove_all(dir + "/t", ec), 8u);
  EXPECT_FALSE(ec);
  EXPECT_FALSE(exists(dir + "/t"));
  EXPECT_EQ(testing::read_file(keep + "/precious"), "p");
  EXPECT_TRUE(is_directory(keep));

  // A symlink to a folder given itself: the link goes, the folder stays.
  create_symlink(keep, dir + "/link");
  EXPECT_EQ(remove_all(dir + "/link", ec), 1u);
  EXPECT_FALSE(is_symlink(dir + "/link"));
  EXPECT_EQ(testing::read_file(keep + "/precious"), "p");

  EXPECT_EQ(remove_all(dir + "/absent", ec), 0u);
  EXPECT_FALSE(ec);
  paths_test_write(dir + "/file", "x");
  EXPECT_EQ(remove_all(dir + "/file"), 1u);

  if (::geteuid() != 0) {  // a folder whose entries cannot be removed is an error
    create_directories(dir + "/locked/inner");
    ASSERT_EQ(::chmod((dir + "/locked").c_str(), 0555), 0);
    remove_all(dir + "/locked", ec);
    EXPECT_EQ(ec, std::errc::permission_denied);
    EXPECT_THROW(remove_all(dir + "/locked"), Error);
    ::chmod((dir + "/locked").c_str(), 0755);
  }
}

TEST(PathChanges, CopyResizeAndSymlink) {
  const std::string dir = testing::scratch_dir("paths-copy");
  create_directories(dir + "/from/sub");
  paths_test_write(dir + "/from/a", "alpha");
  paths_test_write(dir + "/from/sub/b", std::string(200000, 'b'));
  ASSERT_EQ(::chmod((dir + "/from/a").c_str(), 0600), 0);
  create_symlink("a", dir + "/from/link");

  copy_tree(dir + "/from", dir + "/to");
  EXPECT_EQ(list_directory(dir + "/to"), (Names{"a", "link", "sub"}));
  EXPECT_EQ(testing::read_file(dir + "/to/a"), "alpha");
  EXPECT_EQ(testing::read_file(dir + "/to/sub/b"), std::string(200000, 'b'));
  EXPECT_FALSE(is_symlink(dir + "/to/link"));  // copied as the file it points to
  EXPECT_EQ(testing::read_file(dir + "/to/link"), "alpha");
  struct stat st;
  ASSERT_EQ(::stat((dir + "/to/a").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_THROW(copy_file(dir + "/from/a", dir + "/to/a"), Error);  // never overwrites
  EXPECT_THROW(copy_file(dir + "/absent", dir + "/to/x"), Error);

  resize_file(dir + "/to/a", 2);
  EXPECT_EQ(testing::read_file(dir + "/to/a"), "al");
  resize_file(dir + "/to/a", 4);
  EXPECT_EQ(testing::read_file(dir + "/to/a"), std::string("al\0\0", 4));
  EXPECT_THROW(resize_file(dir + "/absent", 1), Error);
  EXPECT_THROW(create_symlink("a", dir + "/to/a"), Error);
}

}  // namespace
}  // namespace dtorch::paths
