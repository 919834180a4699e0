// TensorBoard event files for `dtorch train --tensorboard DIR`: scalars written the way
// TensorFlow's summary writer writes them, so TensorBoard (and its Python event reader) opens
// them with nothing of TensorFlow or protobuf linked into dtorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace dtorch::report {

// Note [TensorBoard event files]
// A file named events.out.tfevents.<seconds>.<host>.<pid>.dtorch holds TFRecords: a uint64
// length, the masked CRC-32C of those 8 bytes, the payload, and its masked CRC-32C (masked:
// rotate right by 15, add 0xa282ead8; all little-endian). Each payload is a tensorflow.Event
// protocol buffer, encoded by hand: wall_time (field 1, double), step (2, int64) and either
// file_version (3, "brain.Event:2", the first record) or summary (5) holding one
// Summary.Value {tag (1), simple_value (2, float)}. Records are flushed as they are written,
// so TensorBoard follows a run live and a crash loses nothing written before it.

/// CRC-32C (Castagnoli), the checksum of TFRecords.
uint32_t crc32c(const void* data, size_t n);

/// Appends scalars to a new event file in `dir` (created with its parents). Rank 0's only.
class TensorBoardWriter {
 public:
  /// ConfigError naming the folder and the flag when it cannot be created or written.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// One scalar `tag` ("train/loss") at `step`, stamped with the current time.
  void scalar(const std::string& tag, int64_t step, double value);

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);

  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace dtorch::report
