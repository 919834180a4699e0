// State-dict files in torch.save's format (model.pt, a sharded checkpoint's shard and full
// files): the input is the file, parsed by unpickle_state_dict and, as `load_state_dict(module,
// path)` does for a file a user names, loaded into gpt-debug (the seeds' model).
#include <cstdint>
#include <vector>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/models/registry.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(torch_save) {
  using namespace dtorch;
  static const std::shared_ptr<models::Model> model = models::make_model("gpt-debug");
  static const std::string path = paths::join(fuzz::scratch(), "model.pt");
  const std::vector<char> bytes(data, data + size);
  fuzz::accept_errors([&] { (void)checkpoint::unpickle_state_dict(bytes, "model.pt"); });
  fuzz::write_file(path, data, size);
  return fuzz::accept_errors([&] { checkpoint::load_state_dict(*model, path); });
}
