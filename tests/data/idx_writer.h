// Test helper: writes small IDX files (raw or gzipped with the system's gzip), valid or
// deliberately broken, so the readers are tested without the real datasets.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtorch::testing {

/// IDX bytes: magic 00 00 type ndims, big-endian dims, then `data`.
inline std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims,
                                      const std::vector<uint8_t>& data, uint8_t type = 0x08) {
  std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int shift : {24, 16, 8, 0})
      out.push_back(static_cast<uint8_t>(d >> shift));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

/// Writes `bytes` gzip-compressed to `path` (through /bin/gzip, which every Debian has).
inline void write_gzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  write_bytes(path + ".raw", bytes);
  std::string cmd = "gzip -c '" + path + ".raw' > '" + path + "' && rm '" + path + ".raw'";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("gzip failed: " + cmd);
}

/// n pseudo-random bytes (deterministic).
inline std::vector<uint8_t> pattern(size_t n, uint32_t seed = 1) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = static_cast<uint8_t>(seed >> 24);
  }
  return v;
}

}  // namespace dtorch::testing
