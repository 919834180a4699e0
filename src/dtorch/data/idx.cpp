// IDX reader on zlib's gz* functions, which read gzip and raw files alike, so a user can
// gunzip the dataset or not. Every failure names the file and what is wrong with it.
#include "dtorch/data/idx.h"

#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dtorch/core/error.h"
#include "dtorch/core/input_file.h"

namespace dtorch::data {
namespace {

// Deflate expands a byte to at most 1032 (zlib's technical notes): a header announcing more data
// than the file could hold, even compressed, is corrupt, and is refused before allocating.
constexpr uint64_t kMaxDeflateRatio = 1032;
// gzread takes an unsigned int length and returns an int, so read big files in pieces.
constexpr uint64_t kChunk = uint64_t{1} << 30;

const char* type_name(int type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
  }
  return "unknown";
}

// Owns a gzFile so every early throw closes it.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    errno = 0;
    f_ = gzopen(path.c_str(), "rb");
    DTORCH_CHECK_T(DataError, f_ != nullptr, "IDX file ", path, ": cannot open it (",
                   errno ? std::strerror(errno) : "out of memory", ")");
  }
  ~GzFile() { gzclose(f_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes; fewer only at end of file. Throws on a corrupt gzip stream.
  uint64_t read(void* dst, uint64_t n) {
    uint64_t done = 0;
    auto* out = static_cast<unsigned char*>(dst);
    while (done < n) {
      auto want = static_cast<unsigned>(std::min(kChunk, n - done));
      int got = gzread(f_, out + done, want);
      if (got < 0) {
        int code = 0;
        const char* why = gzerror(f_, &code);
        DTORCH_FAIL(DataError, "IDX file ", path_, ": cannot read it: ", why,
                    " (the gzip data is corrupt: re-download the file or reinstall its package)");
      }
      if (got == 0) break;
      done += static_cast<uint64_t>(got);
    }
    return done;
  }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

uint32_t big_endian_u32(const unsigned char* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

}  // namespace

torch::Tensor read_idx(const std::string& path, int64_t max_items, int64_t* items_in_file) {
  std::string problem;
  uint64_t file_bytes = 0;
  const int fd = open_input_file(path, kAnySize, &file_bytes, &problem);
  DTORCH_CHECK_T(DataError, fd >= 0, "IDX file ", path, ": ", problem);
  ::close(fd);
  const uint64_t max_bytes = file_bytes * kMaxDeflateRatio;
  GzFile f(path);

  // Header: two zero bytes, the element type, the number of dimensions, then one
  // big-endian uint32 per dimension.
  unsigned char magic[4];
  uint64_t got = f.read(magic, 4);
  DTORCH_CHECK_T(DataError, got == 4, "IDX file ", path, ": truncated: ", got,
                 " bytes, shorter than the 4-byte magic number");
  DTORCH_CHECK_T(DataError, magic[0] == 0 && magic[1] == 0 && magic[3] >= 1 && magic[3] <= 8,
                 "IDX file ", path, ": bad magic number 0x", std::hex, big_endian_u32(magic),
                 std::dec, ": not an IDX file (expected bytes 00 00 <type> <1..8 dimensions>)");
  const int type = magic[2];
  DTORCH_CHECK_T(DataError, type == 0x08, "IDX file ", path, ": unsupported element type 0x",
                 std::hex, type, std::dec, " (", type_name(type),
                 "); dtorch reads unsigned-byte IDX files (type 0x08), as MNIST ships");

  const int ndims = magic[3];
  std::vector<unsigned char> dim_bytes(4 * ndims);
  got = f.read(dim_bytes.data(), dim_bytes.size());
  DTORCH_CHECK_T(DataError, got == dim_bytes.size(), "IDX file ", path,
                 ": truncated inside its header (", ndims, " dimensions announced)");
  std::vector<int64_t> sizes;
  uint64_t total = 1;
  uint64_t span = 1;  // the non-zero dimensions' product: the strides of an empty tensor too
  std::string shape;
  for (int d = 0; d < ndims; ++d) {
    uint32_t n = big_endian_u32(&dim_bytes[4 * d]);
    sizes.push_back(static_cast<int64_t>(n));
    shape += str(d ? "x" : "", n);
    // Check before multiplying so a garbage header cannot overflow the product.
    DTORCH_CHECK_T(DataError, n == 0 || total <= max_bytes / n, "IDX file ", path,
                   ": header announces ", shape, "... bytes, more than its ", file_bytes,
                   " bytes could hold: the file is corrupt");
    DTORCH_CHECK_T(DataError, n == 0 || span <= (uint64_t{1} << 40) / n, "IDX file ", path,
                   ": header announces ", shape,
                   "..., dimensions no data set has: the file is corrupt");
    total *= n;
    if (n != 0) span *= n;
  }

  if (items_in_file != nullptr) *items_in_file = sizes[0];
  const bool whole = max_items < 0 || max_items >= sizes[0];
  if (!whole) {
    total = total / static_cast<uint64_t>(sizes[0]) * static_cast<uint64_t>(max_items);
    sizes[0] = max_items;
  }
  torch::Tensor out = torch::empty({static_cast<int64_t>(total)}, torch::kUInt8);
  got = f.read(out.data_ptr<uint8_t>(), total);
  DTORCH_CHECK_T(DataError, got == total, "IDX file ", path, ": truncated: its header announces ",
                 shape, whole ? " =" : str(", of which the first ", max_items, " items take"), " ",
                 total, " data bytes but the file ends after ", got,
                 " of them (re-download the file or reinstall its package)");
  unsigned char extra;
  DTORCH_CHECK_T(DataError, !whole || f.read(&extra, 1) == 0, "IDX file ", path,
                 ": has bytes after the ", shape,
                 " data its header announces: the header or the file is wrong");
  return out.view(sizes);
}

}  // namespace dtorch::data
