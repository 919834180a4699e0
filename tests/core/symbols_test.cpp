// What dtorch's binaries import from libstdc++ that LibTorch exports too: no std::filesystem at
// all (Note [No std::filesystem]), and otherwise only Note [libstdc++ symbols LibTorch exports].
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dtorch/core/paths.h"

namespace dtorch {
namespace {

// Note [libstdc++ symbols LibTorch exports] in src/dtorch/core/paths.h says why each is safe.
const std::set<std::string> kAllowedLibTorchCopies = {
    "_ZNSt15__exception_ptr13exception_ptr9_M_addrefEv",
    "_ZNSt15__exception_ptr13exception_ptr10_M_releaseEv",
    "_ZSt28__throw_bad_array_new_lengthv",
    "_ZSt21ios_base_library_initv",
};

struct NmSymbol {
  std::string name;       // mangled, without its version ("@GLIBCXX_3.4")
  std::string demangled;  // as nm -C prints it
  char type = '?';        // nm's letter: U undefined, T/D/B/R... defined global, W/V weak
};

// `nm -D <flags>` of `file`: one entry per dynamic symbol, or nullopt when nm fails.
std::optional<std::vector<NmSymbol>> symbols_test_nm(const std::string& flags,
                                                     const std::string& file) {
  auto run = [&](const std::string& extra, std::vector<std::string>* lines) {
    const std::string cmd = "nm -D --no-sort " + flags + extra + " '" + file + "' 2>/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return false;
    std::string out;
    char buf[1 << 16];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;)
      out.append(buf, n);
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) lines->push_back(line);
    return ::pclose(p) == 0;
  };
  std::vector<std::string> raw, readable;
  if (!run("", &raw) || !run(" -C", &readable) || raw.size() != readable.size())
    return std::nullopt;
  // Lines read "<value> <type> <name>", the value blank for undefined symbols.
  auto split = [](const std::string& line, char* type) {
    std::string name = line.size() > 19 ? line.substr(19) : "";
    *type = line.size() > 17 ? line[17] : '?';
    return name;
  };
  std::vector<NmSymbol> out;
  for (size_t i = 0; i < raw.size(); ++i) {
    NmSymbol s;
    s.name = split(raw[i], &s.type);
    s.name = s.name.substr(0, s.name.find('@'));
    char unused;
    s.demangled = split(readable[i], &unused);
    out.push_back(std::move(s));
  }
  return out;
}

bool symbols_test_have_nm() {
  return std::system("nm --version >/dev/null 2>&1") == 0;
}

// The shared libraries this process has loaded whose file name starts with `prefix`.
std::set<std::string> symbols_test_loaded(const std::string& prefix) {
  std::set<std::string> libs;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (paths::file_name(path).rfind(prefix, 0) == 0) libs.insert(path);
  }
  return libs;
}

// The binaries dtorch builds, by what the message calls them.
std::map<std::string, std::string> symbols_test_binaries() {
  return {{"libdtorch.so", std::string(DTORCH_BINARY_DIR) + "/libdtorch.so"},
          {"the dtorch command", DTORCH_CLI},
          {"the test binary", paths::executable_path()}};
}

TEST(LinkedSymbols, NoBinaryImportsStdFilesystem) {
  if (!symbols_test_have_nm()) GTEST_SKIP() << "nm is not installed (Debian: binutils)";
  for (const auto& [what, file] : symbols_test_binaries()) {
    auto imports = symbols_test_nm("--undefined-only", file);
    ASSERT_TRUE(imports.has_value()) << "nm -D cannot read " << file;
    EXPECT_GT(imports->size(), 10u) << file;
    for (const NmSymbol& s : *imports) {
      const bool filesystem = s.name.rfind("_ZNSt10filesystem", 0) == 0 ||
                              s.name.rfind("_ZNKSt10filesystem", 0) == 0 ||
                              s.name.find("St10filesystem") != std::string::npos ||
                              s.demangled.find("std::filesystem") != std::string::npos ||
                              s.demangled.find("std::__fs") != std::string::npos;
      if (filesystem)
        ADD_FAILURE() << what << " (" << file << ") imports " << s.demangled
                      << ": LibTorch wheels export their own std::filesystem, which the call may "
                         "bind to (Note [No std::filesystem] in src/dtorch/core/paths.h); use "
                         "dtorch/core/paths.h, or turn a header library's use off (CMakeLists.txt "
                         "does for CLI11)";
    }
  }
}

TEST(LinkedSymbols, LibstdcxxSymbolsLibTorchExportsAreTheListedOnes) {
  if (!symbols_test_have_nm()) GTEST_SKIP() << "nm is not installed (Debian: binutils)";
  const std::set<std::string> libstdcxx = symbols_test_loaded("libstdc++.so");
  ASSERT_EQ(libstdcxx.size(), 1u) << "this test binary should have loaded one libstdc++";
  std::set<std::string> libstdcxx_symbols;
  auto defined = symbols_test_nm("--defined-only", *libstdcxx.begin());
  ASSERT_TRUE(defined.has_value()) << "nm -D cannot read " << *libstdcxx.begin();
  for (const NmSymbol& s : *defined)
    libstdcxx_symbols.insert(s.name);

  // Strong (global, not weak) definitions in the LibTorch libraries this process loaded: a
  // dtorch binary's import of such a name can bind to LibTorch's copy instead of libstdc++'s.
  std::set<std::string> torch_libs = symbols_test_loaded("libtorch");
  for (const auto& lib : symbols_test_loaded("libc10"))
    torch_libs.insert(lib);
  ASSERT_FALSE(torch_libs.empty()) << "no LibTorch library in /proc/self/maps";
  std::map<std::string, std::string> torch_copies;  // symbol -> the library exporting it
  for (const auto& lib : torch_libs) {
    auto exports = symbols_test_nm("--defined-only", lib);
    ASSERT_TRUE(exports.has_value()) << "nm -D cannot read " << lib;
    for (const NmSymbol& s : *exports) {
      const bool strong = std::isupper(static_cast<unsigned char>(s.type)) && s.type != 'U' &&
                          s.type != 'W' && s.type != 'V';
      if (strong && libstdcxx_symbols.count(s.name)) torch_copies.emplace(s.name, lib);
    }
  }

  for (const auto& [what, file] : symbols_test_binaries()) {
    auto imports = symbols_test_nm("--undefined-only", file);
    ASSERT_TRUE(imports.has_value()) << "nm -D cannot read " << file;
    for (const NmSymbol& s : *imports) {
      auto copy = torch_copies.find(s.name);
      if (copy == torch_copies.end() || kAllowedLibTorchCopies.count(s.name)) continue;
      ADD_FAILURE() << what << " (" << file << ") imports " << s.demangled << " (" << s.name
                    << ") from libstdc++, and " << copy->second
                    << " exports its own copy, which the call may bind to: see what that copy "
                       "does and list it in Note [libstdc++ symbols LibTorch exports] "
                       "(src/dtorch/core/paths.h) and this test, or stop using it";
    }
  }
}

}  // namespace
}  // namespace dtorch
