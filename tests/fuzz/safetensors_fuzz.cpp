// safetensors files (--save-format safetensors, `dtorch checkpoint consolidate ...
// x.safetensors`): the input is the file, parsed by parse_safetensors and loaded into gpt-debug
// (the seeds' model) as load_state_dict(module, path) does.
#include <cstdint>
#include <vector>

#include "dtorch/checkpoint/safetensors.h"
#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/models/registry.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(safetensors) {
  using namespace dtorch;
  static const std::shared_ptr<models::Model> model = models::make_model("gpt-debug");
  const std::vector<char> bytes(data, data + size);
  return fuzz::accept_errors([&] {
    (void)checkpoint::looks_like_safetensors(bytes);
    checkpoint::StateDict state = checkpoint::parse_safetensors(bytes, "model.safetensors");
    for (const auto& [name, t] : state)
      (void)t.clone();  // every byte range it handed out is readable
    checkpoint::load_state_dict(*model, state, "model.safetensors");
  });
}
