// Tests for TensorBoard event files (Note [TensorBoard event files]): the checksum, and the
// framing of what the writer wrote, read back record by record. (TensorBoard's own reader
// checks a training run's files in tests/tools/train_test.cpp.)
#include "dtorch/report/tensorboard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "dtorch/core/error.h"
#include "support/workers.h"

namespace dtorch::report {
namespace {

uint32_t masked(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

template <typename T>
T little_endian(const std::string& s, size_t at) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<T>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

TEST(TensorBoard, Crc32cIsCastagnolis) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u) << "the CRC-32C check value";
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(TensorBoard, RecordsAreFramedAndChecksummed) {
  const std::string dir = testing::scratch_dir("tensorboard_frames");
  std::string path;
  {
    TensorBoardWriter w(dir + "/board");
    w.scalar("train/loss", 3, 0.25);
    w.scalar("epoch/test_accuracy", 7, 0.875);
    path = w.path();
  }
  EXPECT_NE(path.find("/board/events.out.tfevents."), std::string::npos) << path;
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> payloads;
  for (size_t at = 0; at < bytes.size();) {
    ASSERT_LE(at + 12, bytes.size());
    const auto n = little_endian<uint64_t>(bytes, at);
    EXPECT_EQ(little_endian<uint32_t>(bytes, at + 8), masked(crc32c(bytes.data() + at, 8)));
    ASSERT_LE(at + 12 + n + 4, bytes.size());
    const std::string payload = bytes.substr(at + 12, n);
    EXPECT_EQ(little_endian<uint32_t>(bytes, at + 12 + n), masked(crc32c(payload.data(), n)));
    payloads.push_back(payload);
    at += 12 + n + 4;
  }
  ASSERT_EQ(payloads.size(), 3u) << "the version record, then one per scalar";
  EXPECT_NE(payloads[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(payloads[1].find("train/loss"), std::string::npos);
  // The float 0.25 after the Value's field-2 key (0x15).
  float quarter = 0.25f;
  std::string bits(reinterpret_cast<const char*>(&quarter), 4);
  EXPECT_NE(payloads[1].find(std::string("\x15", 1) + bits), std::string::npos);
  // Event.step (field 2, varint): 0x10 then 7.
  EXPECT_NE(payloads[2].find(std::string("\x10\x07", 2)), std::string::npos);
}

TEST(TensorBoard, AnUnwritableFolderNamesTheFlag) {
  const std::string dir = testing::scratch_dir("tensorboard_unwritable");
  std::ofstream(dir + "/file") << "x";
  try {
    TensorBoardWriter w(dir + "/file/board");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--tensorboard " + dir + "/file/board"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dtorch::report
