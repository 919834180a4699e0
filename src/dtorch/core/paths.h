// Paths and the file system on POSIX calls: what dtorch needs of std::filesystem, which no dtorch
// binary may use (Note [No std::filesystem]).
#pragma once

#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

// Note [No std::filesystem]
// PyPI's torch wheels link libstdc++'s std::filesystem into LibTorch and export those copies
// (pytorch#133437): torch 2.11's libtorch.so exports 64 std::filesystem functions, 2.15's
// libtorch_cpu.so 142. The dynamic linker binds a dtorch binary's call to the first library in
// the search order that defines the name, and an unversioned definition satisfies the binary's
// versioned reference (GLIBCXX_3.4.26), so the call can land in LibTorch's copy rather than
// libstdc++'s: on Ubuntu 24.04 with g++ 13, `std::filesystem::remove_all(path, error_code&)`
// bound to 2.11's copy and jumped to address 0 (at every `dtorch launch` exit and in every
// test's TempDir). Preloading the system's libstdc++ hid it; linking -lstdc++ first did not.
// PyTorch's own remedy was to stop using <filesystem> on Linux (pytorch PR 134494); dtorch does
// the same: nothing under src/, tools/, tests/ or examples/ includes <filesystem>, the functions
// below stand in for it, and tests/core/symbols_test.cpp fails on any std::filesystem symbol
// that libdtorch.so, the dtorch command or the test binary imports.
//
// Note [libstdc++ symbols LibTorch exports]
// The wheels export a few other libstdc++ functions, defined strongly, and a dtorch binary's
// import of one binds to LibTorch's copy the same way. symbols_test.cpp allows exactly these
// (Debian's 1.13 exports none that dtorch imports):
// - std::__exception_ptr::exception_ptr::_M_addref() and _M_release() (libtorch_cpu.so of 2.11
//   and 2.15), copying and destroying a std::exception_ptr: instruction for instruction
//   libstdc++'s own code for this ABI. An atomic add to the reference count in the exception's
//   header; on the last release, the exception's destructor and __cxa_free_exception, called
//   through the PLT, so the memory goes back to the libstdc++ that allocated it. No state.
// - std::__throw_bad_array_new_length() (libtorch.so and libc10.so of both): allocates and throws
//   std::bad_array_new_length through libstdc++'s __cxa_allocate_exception, __cxa_throw,
//   typeinfo and vtable, all imported. No state.
// - std::ios_base_library_init() (libtorch.so of both): g++ 13's <iostream> references it so that
//   a libstdc++ that constructs std::cout itself gets loaded; nothing calls it. Both copies are an
//   empty function. (g++ 12's <iostream> does not reference it.)
// Any other such import fails the test, naming the symbol: read what LibTorch's copy does (objdump
// -d) before adding it here.

namespace dtorch::paths {

// ---- names: string operations on POSIX paths, no file system access --------------------------
// Each gives what std::filesystem::path gives for the same string.

/// `a` / `b`: "a/b"; `b` when `a` is empty or `b` is absolute; no second "/" when `a` ends in one.
std::string join(const std::string& a, const std::string& b);
template <typename... More>
std::string join(const std::string& a, const std::string& b, const More&... more) {
  return join(join(a, b), more...);
}
/// Everything before the last name, without trailing "/" (but "/" for "/x"); "" for "x".
/// "a/b/" is the folder "a/b" with an empty last name, so its parent is "a/b".
std::string parent_path(const std::string& p);
/// The last name: "c" for "a/b/c", "" for "a/b/" and "/".
std::string file_name(const std::string& p);
/// The last name's suffix from its last ".": ".png"; "" for "a", ".hidden", "." and "..".
std::string extension(const std::string& p);
/// The path with "//" and "." elements and "name/.." pairs removed: "a/./b/../c" -> "a/c",
/// "a/b/.." -> "a/", "a/.." -> ".".
std::string lexically_normal(const std::string& p);

// ---- queries: never throw; false (or "") when the path cannot be examined -------------------

/// Whether something is at `p` (a symlink counts as what it points to).
bool exists(const std::string& p);
bool is_directory(const std::string& p);
bool is_regular_file(const std::string& p);
/// What is at `p` (a symlink counts as what it points to), for messages: "a regular file", "a
/// directory", "a FIFO (named pipe)", "a character device", "a block device", "a socket"; ""
/// when nothing is.
std::string kind(const std::string& p);
/// The same for a stat(2) st_mode.
std::string kind_of_mode(unsigned mode);
/// Whether `p` itself is a symbolic link (not followed).
bool is_symlink(const std::string& p);
/// A directory with no entries, or a regular file of 0 bytes.
bool is_empty(const std::string& p);
/// The file's size in bytes; sets `ec` (and returns 0) when it cannot be read.
uint64_t file_size(const std::string& p, std::error_code& ec);
/// The target of the symbolic link `p`, as stored; "" with `ec` set on failure.
std::string read_symlink(const std::string& p, std::error_code& ec);
/// The absolute path with every symlink, "." and ".." resolved (realpath); "" with `ec` set
/// when `p` does not exist.
std::string canonical(const std::string& p, std::error_code& ec);

/// The names in directory `dir` (not "." and ".."), sorted; empty with `ec` set when it cannot
/// be read.
std::vector<std::string> list_directory(const std::string& dir, std::error_code& ec);
/// Every regular file under `dir` (symlinks to files included) as "dir/sub/name", sorted,
/// descending into sub-folders but not into symlinked ones. An entry whose name `skip` accepts
/// is left out, a folder with all it holds. Stops with `ec` set at the first unreadable folder.
std::vector<std::string> list_files_recursively(const std::string& dir, std::error_code& ec,
                                                bool (*skip)(const std::string& name) = nullptr);

// ---- changes: the std::error_code forms never throw ------------------------------------------

/// Creates `p`; false with `ec` clear when a directory is there already.
bool create_directory(const std::string& p, std::error_code& ec);
/// Creates `p` and its missing parents (mkdir -p); false with `ec` clear when it existed.
/// A non-directory in the way sets `ec`.
bool create_directories(const std::string& p, std::error_code& ec);
/// Removes the file, symlink or empty directory `p`; false with `ec` clear when nothing was there.
bool remove(const std::string& p, std::error_code& ec);
/// Removes `p` and everything under it, and returns how many entries went. Symbolic links are
/// removed, never followed. Nothing there is no error (0).
uint64_t remove_all(const std::string& p, std::error_code& ec);
/// rename(2): replaces a file, or an empty directory, at `to`.
void rename(const std::string& from, const std::string& to, std::error_code& ec);
/// A new private folder (mkdtemp) named PREFIX-XXXXXX under $TMPDIR, or /tmp; "" with `ec` set
/// when it cannot be made.
std::string make_temp_directory(const std::string& prefix, std::error_code& ec);

// ---- the same, throwing dtorch::Error naming the path and the reason ----------------------------

uint64_t file_size(const std::string& p);
bool create_directory(const std::string& p);
bool create_directories(const std::string& p);
bool remove(const std::string& p);
uint64_t remove_all(const std::string& p);
void rename(const std::string& from, const std::string& to);
std::vector<std::string> list_directory(const std::string& dir);
/// The path of the running program (/proc/self/exe's target).
std::string executable_path();
/// Copies the bytes and permissions of regular file `from` to a new file `to` (which must not
/// exist).
void copy_file(const std::string& from, const std::string& to);
/// Copies directory `from` into `to` (created when missing) with all its files and folders;
/// symlinks are copied as the files they point to. Fails on a file `to` already has.
void copy_tree(const std::string& from, const std::string& to);
/// write(2)s all of `n` bytes to `fd`, retrying short writes and EINTR; false (errno set) on
/// an error.
bool write_fully(int fd, const char* data, size_t n);
/// Makes `p` `size` bytes long, cutting or extending with zero bytes.
void resize_file(const std::string& p, uint64_t size);
/// Creates a symbolic link at `link` that points to `target` (stored as given).
void create_symlink(const std::string& target, const std::string& link);

}  // namespace dtorch::paths
