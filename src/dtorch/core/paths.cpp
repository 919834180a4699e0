// paths.h on POSIX calls (stat, opendir, mkdir, unlink, rename, readlink), so that no dtorch
// binary imports std::filesystem (Note [No std::filesystem]).
#include "dtorch/core/paths.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "dtorch/core/error.h"

namespace dtorch::paths {
namespace {

std::error_code last_error() {
  return std::error_code(errno, std::generic_category());
}

// Length of the leading run of "/": the root, when there is one.
size_t root_length(const std::string& p) {
  size_t n = 0;
  while (n < p.size() && p[n] == '/')
    ++n;
  return n;
}

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};
using DirHandle = std::unique_ptr<DIR, DirCloser>;

// The names an open directory holds, sorted; sets `ec` when reading fails.
std::vector<std::string> names_in(DIR* d, std::error_code& ec) {
  std::vector<std::string> names;
  while (true) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (!e) {
      if (errno != 0) ec = last_error();
      break;
    }
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void collect_files(const std::string& dir, std::vector<std::string>* files, std::error_code& ec,
                   bool (*skip)(const std::string&)) {
  for (const std::string& name : list_directory(dir, ec)) {
    if (skip && skip(name)) continue;
    const std::string p = join(dir, name);
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0) continue;  // gone since the listing
    if (S_ISDIR(st.st_mode)) {
      collect_files(p, files, ec, skip);
      if (ec) return;
    } else if (S_ISREG(st.st_mode) || (S_ISLNK(st.st_mode) && is_regular_file(p))) {
      files->push_back(p);
    }
  }
}

}  // namespace

bool write_fully(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// ---- names -----------------------------------------------------------------------------------

std::string make_temp_directory(const std::string& prefix, std::error_code& ec) {
  ec.clear();
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  if (::mkdtemp(pattern.data()) != nullptr) return pattern;
  ec = std::error_code(errno, std::generic_category());
  return "";
}

std::string join(const std::string& a, const std::string& b) {
  if (a.empty() || (!b.empty() && b[0] == '/')) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

std::string parent_path(const std::string& p) {
  const size_t root = root_length(p);
  if (root == p.size()) return p;  // "" or only the root: nothing to go up from
  // The last name starts after the last "/" (and is the empty one after a trailing "/").
  const size_t last = p.rfind('/');
  size_t end = p.back() == '/' ? p.size() : (last == std::string::npos ? 0 : last + 1);
  while (end > root && p[end - 1] == '/')
    --end;
  return end == root && root > 0 ? "/" : p.substr(0, end);
}

std::string file_name(const std::string& p) {
  if (p.empty() || p.back() == '/') return "";
  const size_t last = p.rfind('/');
  return last == std::string::npos ? p : p.substr(last + 1);
}

std::string extension(const std::string& p) {
  const std::string name = file_name(p);
  if (name == "." || name == "..") return "";
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot == 0) return "";
  return name.substr(dot);
}

std::string lexically_normal(const std::string& p) {
  if (p.empty()) return "";
  const bool absolute = p[0] == '/';
  // A trailing "/" names the folder itself, as a trailing "/." does: "a/b/" is "a/b/.".
  const std::string q = p.back() == '/' ? p + "." : p;
  std::vector<std::string> names;
  bool trailing = false;  // the result ends in "/": its last "." or "name/.." was removed
  size_t at = 0;
  while (at <= q.size()) {
    size_t end = q.find('/', at);
    if (end == std::string::npos) end = q.size();
    const std::string name = q.substr(at, end - at);
    at = end + 1;
    if (name.empty()) continue;
    if (name == ".") {
      trailing = true;
    } else if (name == ".." && !names.empty() && names.back() != "..") {
      names.pop_back();
      trailing = true;
    } else if (name != ".." || !absolute) {  // "/.." is "/"
      names.push_back(name);
      trailing = false;
    }
  }
  std::string out = absolute ? "/" : "";
  for (size_t i = 0; i < names.size(); ++i)
    out += (i ? "/" : "") + names[i];
  if (trailing && !names.empty() && names.back() != "..") out += "/";
  return out.empty() ? "." : out;
}

// ---- queries ---------------------------------------------------------------------------------

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

bool is_directory(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_regular_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string kind_of_mode(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string kind(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 ? kind_of_mode(st.st_mode) : "";
}

bool is_symlink(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

bool is_empty(const std::string& p) {
  struct stat st;
  if (::stat(p.c_str(), &st) != 0) return false;
  if (S_ISREG(st.st_mode)) return st.st_size == 0;
  if (!S_ISDIR(st.st_mode)) return false;
  std::error_code ec;
  return list_directory(p, ec).empty() && !ec;
}

uint64_t file_size(const std::string& p, std::error_code& ec) {
  ec.clear();
  struct stat st;
  if (::stat(p.c_str(), &st) != 0) {
    ec = last_error();
    return 0;
  }
  if (!S_ISREG(st.st_mode)) {
    ec = std::make_error_code(S_ISDIR(st.st_mode) ? std::errc::is_a_directory
                                                  : std::errc::not_supported);
    return 0;
  }
  return static_cast<uint64_t>(st.st_size);
}

std::string read_symlink(const std::string& p, std::error_code& ec) {
  ec.clear();
  std::string buf(256, '\0');
  while (true) {
    const ssize_t n = ::readlink(p.c_str(), buf.data(), buf.size());
    if (n < 0) {
      ec = last_error();
      return "";
    }
    if (static_cast<size_t>(n) < buf.size()) {
      buf.resize(static_cast<size_t>(n));
      return buf;
    }
    buf.resize(buf.size() * 2);  // perhaps cut short: try again with room to spare
  }
}

std::string canonical(const std::string& p, std::error_code& ec) {
  ec.clear();
  std::unique_ptr<char, decltype(&std::free)> resolved(::realpath(p.c_str(), nullptr), &std::free);
  if (!resolved) {
    ec = last_error();
    return "";
  }
  return resolved.get();
}

std::vector<std::string> list_directory(const std::string& dir, std::error_code& ec) {
  ec.clear();
  DirHandle d(::opendir(dir.c_str()));
  if (!d) {
    ec = last_error();
    return {};
  }
  return names_in(d.get(), ec);
}

std::vector<std::string> list_files_recursively(const std::string& dir, std::error_code& ec,
                                                bool (*skip)(const std::string& name)) {
  ec.clear();
  std::vector<std::string> files;
  collect_files(dir, &files, ec, skip);
  // Whole paths in order: "a/b-c" before "a/b/x", which visiting "b" before "b-c" would not give.
  std::sort(files.begin(), files.end());
  return files;
}

// ---- changes ---------------------------------------------------------------------------------

bool create_directory(const std::string& p, std::error_code& ec) {
  ec.clear();
  if (::mkdir(p.c_str(), 0777) == 0) return true;
  const int err = errno;
  if (err != EEXIST || !is_directory(p)) ec = std::error_code(err, std::generic_category());
  return false;
}

bool create_directories(const std::string& p, std::error_code& ec) {
  ec.clear();
  if (p.empty()) {
    ec = std::make_error_code(std::errc::invalid_argument);
    return false;
  }
  std::string dir = p;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) ec = std::make_error_code(std::errc::not_a_directory);
    return false;
  }
  const std::string parent = parent_path(dir);
  if (!parent.empty() && parent != dir) {
    create_directories(parent, ec);
    if (ec) return false;
  }
  return create_directory(dir, ec);
}

bool remove(const std::string& p, std::error_code& ec) {
  ec.clear();
  if (::remove(p.c_str()) == 0) return true;
  if (errno != ENOENT) ec = last_error();
  return false;
}

uint64_t remove_all(const std::string& p, std::error_code& ec) {
  ec.clear();
  struct stat st;
  if (::lstat(p.c_str(), &st) != 0) {
    if (errno != ENOENT) ec = last_error();
    return 0;
  }
  uint64_t removed = 0;
  if (S_ISDIR(st.st_mode)) {
    // O_NOFOLLOW: should `p` have become a symlink since the lstat, open fails rather than
    // emptying what it points to.
    const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      ec = last_error();
      return 0;
    }
    DirHandle d(::fdopendir(fd));
    if (!d) {
      ec = last_error();
      ::close(fd);
      return 0;
    }
    const std::vector<std::string> names = names_in(d.get(), ec);
    d.reset();
    if (ec) return removed;
    for (const std::string& name : names) {
      removed += remove_all(join(p, name), ec);
      if (ec) return removed;
    }
    if (::rmdir(p.c_str()) != 0) {
      ec = last_error();
      return removed;
    }
  } else if (::unlink(p.c_str()) != 0) {
    if (errno != ENOENT) ec = last_error();
    return 0;
  }
  return removed + 1;
}

void rename(const std::string& from, const std::string& to, std::error_code& ec) {
  ec.clear();
  if (::rename(from.c_str(), to.c_str()) != 0) ec = last_error();
}

// ---- throwing forms --------------------------------------------------------------------------

uint64_t file_size(const std::string& p) {
  std::error_code ec;
  const uint64_t n = file_size(p, ec);
  DTORCH_CHECK(!ec, "cannot read the size of ", p, ": ", ec.message());
  return n;
}

bool create_directory(const std::string& p) {
  std::error_code ec;
  const bool created = create_directory(p, ec);
  DTORCH_CHECK(!ec, "cannot create directory ", p, ": ", ec.message());
  return created;
}

bool create_directories(const std::string& p) {
  std::error_code ec;
  const bool created = create_directories(p, ec);
  DTORCH_CHECK(!ec, "cannot create directory ", p, ": ", ec.message());
  return created;
}

bool remove(const std::string& p) {
  std::error_code ec;
  const bool removed = remove(p, ec);
  DTORCH_CHECK(!ec, "cannot remove ", p, ": ", ec.message());
  return removed;
}

uint64_t remove_all(const std::string& p) {
  std::error_code ec;
  const uint64_t n = remove_all(p, ec);
  DTORCH_CHECK(!ec, "cannot remove ", p, " and what it holds: ", ec.message());
  return n;
}

void rename(const std::string& from, const std::string& to) {
  std::error_code ec;
  rename(from, to, ec);
  DTORCH_CHECK(!ec, "cannot rename ", from, " to ", to, ": ", ec.message());
}

std::vector<std::string> list_directory(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> names = list_directory(dir, ec);
  DTORCH_CHECK(!ec, "cannot list directory ", dir, ": ", ec.message());
  return names;
}

std::string executable_path() {
  std::error_code ec;
  std::string p = read_symlink("/proc/self/exe", ec);
  DTORCH_CHECK(!ec, "cannot find this program's path: /proc/self/exe: ", ec.message(),
               " (is /proc mounted?)");
  return p;
}

void copy_file(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  DTORCH_CHECK(in >= 0, "cannot copy ", from, ": ", std::strerror(errno));
  struct stat st;
  int out = -1;
  if (::fstat(in, &st) == 0)
    out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st.st_mode & 07777);
  if (out < 0) {
    const int err = errno;
    ::close(in);
    DTORCH_FAIL(Error, "cannot copy ", from, " to ", to, ": ", std::strerror(err));
  }
  char buf[1 << 16];
  int err = 0;
  while (err == 0) {
    const ssize_t n = ::read(in, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || !write_fully(out, buf, static_cast<size_t>(n))) err = errno;
  }
  ::close(in);
  if (::close(out) != 0 && err == 0) err = errno;
  DTORCH_CHECK(err == 0, "cannot copy ", from, " to ", to, ": ", std::strerror(err));
}

void copy_tree(const std::string& from, const std::string& to) {
  create_directory(to);
  for (const std::string& name : list_directory(from)) {
    const std::string src = join(from, name);
    if (is_directory(src)) {
      copy_tree(src, join(to, name));
    } else if (is_regular_file(src)) {
      copy_file(src, join(to, name));
    }
  }
}

void resize_file(const std::string& p, uint64_t size) {
  DTORCH_CHECK(::truncate(p.c_str(), static_cast<off_t>(size)) == 0, "cannot resize ", p, " to ",
               size, " bytes: ", std::strerror(errno));
}

void create_symlink(const std::string& target, const std::string& link) {
  DTORCH_CHECK(::symlink(target.c_str(), link.c_str()) == 0, "cannot create symlink ", link, " -> ",
               target, ": ", std::strerror(errno));
}

}  // namespace dtorch::paths
