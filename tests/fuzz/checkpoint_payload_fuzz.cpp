// Training checkpoints (.dtc) behind a valid frame: the input is the payload (the torch.save
// archive of model, optimizer archive, epoch, rng state and metadata), which the harness frames
// with the right magic, version, length and CRC32 (Note [Checkpoint format]), so every mutation
// reaches the unpickler, the optimizer's archive and the checks that apply them.
#include <cstdint>
#include <vector>

#include "checkpoint_target.h"
#include "dtorch/checkpoint/crc32.h"
#include "fuzz_support.h"

namespace {

void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<uint8_t>((v >> (8 * i)) & 0xff));
}

}  // namespace

DTORCH_FUZZ_TARGET(checkpoint_payload) {
  using namespace dtorch;
  static const std::string path = paths::join(fuzz::scratch(), "checkpoint-000001.dtc");
  std::vector<uint8_t> file{'D', 'T', 'O', 'R', 'C', 'H', 'C', 'K'};
  put_le(file, checkpoint::kCheckpointVersion, 4);
  put_le(file, size, 8);
  put_le(file, checkpoint::crc32_of(data, size), 4);
  file.insert(file.end(), data, data + size);
  fuzz::write_file(path, file.data(), file.size());
  return fuzz::accept_errors([&] { fuzz::read_and_restore_checkpoint(path); });
}
