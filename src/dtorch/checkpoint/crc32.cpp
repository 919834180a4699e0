// CRC32 through zlib, fed in pieces because zlib's length argument is a 32-bit uInt.
// Shared by the single-file and the sharded checkpoint formats.
#include "dtorch/checkpoint/crc32.h"

#include <zlib.h>

#include <algorithm>

namespace dtorch::checkpoint {

uint32_t crc32_of(const void* data, size_t n) {
  return crc32_update(static_cast<uint32_t>(crc32(0L, Z_NULL, 0)), data, n);
}

uint32_t crc32_update(uint32_t start, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong crc = start;
  while (n > 0) {
    uInt piece = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, p, piece);
    p += piece;
    n -= piece;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace dtorch::checkpoint
