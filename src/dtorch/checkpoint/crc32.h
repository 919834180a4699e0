// CRC32 (zlib's polynomial, as Python's zlib.crc32) of a byte range: the checksum every dtorch
// checkpoint format records, so truncation and bit rot are caught before a file is parsed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtorch::checkpoint {

/// zlib's crc32 of `n` bytes at `data` (any length; zlib itself takes at most 4 GiB a call).
uint32_t crc32_of(const void* data, size_t n);

}  // namespace dtorch::checkpoint
