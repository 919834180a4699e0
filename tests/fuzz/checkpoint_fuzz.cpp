// Training checkpoints (.dtc, Note [Checkpoint format]) as the file is: its framing (magic,
// version, length, CRC32) guards the payload, so mutations mostly test the framing;
// checkpoint_payload_fuzz gets past it.
#include <cstdint>

#include "checkpoint_target.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(checkpoint) {
  using namespace dtorch;
  static const std::string path = paths::join(fuzz::scratch(), "checkpoint-000001.dtc");
  fuzz::write_file(path, data, size);
  return fuzz::accept_errors([&] { fuzz::read_and_restore_checkpoint(path); });
}
