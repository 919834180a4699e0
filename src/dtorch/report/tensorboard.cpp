// TensorBoard event files (Note [TensorBoard event files] in tensorboard.h): the protocol
// buffers and the TFRecord framing, each a few lines.
#include "dtorch/report/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"

namespace dtorch::report {
namespace {

constexpr std::array<uint32_t, 256> kCrc32cTable = [] {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // Castagnoli, reflected
    t[i] = c;
  }
  return t;
}();

uint32_t masked_crc(const std::string& bytes) {
  const uint32_t crc = crc32c(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

template <typename T>
void put_little_endian(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Protocol buffer fields: the key (field number, wire type), then the value.
void put_bytes_field(std::string& out, int field, const std::string& bytes) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_double_field(std::string& out, int field, double v) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | 1);
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_little_endian(out, bits);
}

void put_float_field(std::string& out, int field, float v) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | 5);
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_little_endian(out, bits);
}

void put_varint_field(std::string& out, int field, int64_t v) {
  put_varint(out, static_cast<uint64_t>(field) << 3);
  put_varint(out, static_cast<uint64_t>(v));
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An Event: its time and step, then the fields in `rest`.
std::string event(int64_t step, const std::string& rest) {
  std::string e;
  put_double_field(e, 1, now_seconds());
  put_varint_field(e, 2, step);
  return e + rest;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i)
    crc = kCrc32cTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  paths::create_directories(dir, ec);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  path_ = str(dir, "/events.out.tfevents.", static_cast<int64_t>(now_seconds()), ".", host, ".",
              ::getpid(), ".dtorch");
  f_ = std::fopen(path_.c_str(), "wb");
  DTORCH_CHECK_T(ConfigError, f_ != nullptr, "--tensorboard ", dir, ": cannot create ", path_, ": ",
                 std::strerror(errno), "; give a folder you can write to");
  std::string version;
  put_bytes_field(version, 3, "brain.Event:2");
  write_record(event(0, version));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value) {
  std::string v, summary, rest;
  put_bytes_field(v, 1, tag);
  put_float_field(v, 2, static_cast<float>(value));
  put_bytes_field(summary, 1, v);
  put_bytes_field(rest, 5, summary);
  write_record(event(step, rest));
}

void TensorBoardWriter::write_record(const std::string& payload) {
  std::string header;
  put_little_endian(header, static_cast<uint64_t>(payload.size()));
  std::string record = header;
  put_little_endian(record, masked_crc(header));
  record += payload;
  put_little_endian(record, masked_crc(payload));
  const bool ok =
      std::fwrite(record.data(), 1, record.size(), f_) == record.size() && std::fflush(f_) == 0;
  DTORCH_CHECK_T(ConfigError, ok, "cannot write TensorBoard events to ", path_, ": ",
                 std::strerror(errno), " (disk full?)");
}

}  // namespace dtorch::report
