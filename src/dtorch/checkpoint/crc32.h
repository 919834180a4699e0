// CRC32 (zlib's polynomial, as Python's zlib.crc32) of a byte range: the checksum every dtorch
// checkpoint format records, so truncation and bit rot are caught before a file is parsed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtorch::checkpoint {

/// zlib's crc32 of `n` bytes at `data` (any length), by folding where the CPU can (Note
/// [Folded CRC-32] in crc32.cpp).
uint32_t crc32_of(const void* data, size_t n);
/// The crc32 of bytes whose earlier part had `crc`, continued over `n` more bytes at `data`:
/// crc32_of(a + b) == crc32_update(crc32_of(a), b).
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

}  // namespace dtorch::checkpoint
