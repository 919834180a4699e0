// torch.save's file format from C++ without TorchScript's type tags.
#include "dtorch/checkpoint/torch_save.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

namespace dtorch::checkpoint {

// Note [Files torch.load reads]
// torch::pickle_save writes TorchScript's flavour of the format: every typed dict and list is
// wrapped in torch.jit._pickle.restore_type_tag(value, "Dict[str, Tensor]"). Python's
// torch.load rejects that global when weights_only=True, the default from PyTorch 2.6
// ("Unsupported global: torch.jit._pickle.restore_type_tag"), so a user of current PyTorch
// could not load dtorch's model.pt without turning the safety check off. The same Pickler
// with tag_aggregates = false writes what Python's own torch.save writes for a dict of
// tensors: builtins dict, torch._utils._rebuild_tensor_v2, torch.FloatStorage and
// collections.OrderedDict, all on weights_only's allow-list; LibTorch 1.13 and 2.x both read
// it back. The container (zip, 64-byte aligned records, data.pkl plus data/<n> per storage)
// is LibTorch's own writer, as in torch::pickle_save.
std::vector<char> torch_save_bytes(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t n) { pickle.insert(pickle.end(), buf, buf + n); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();

  std::vector<char> out;
  out.reserve(pickle.size());
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    const char* bytes = static_cast<const char*>(data);
    out.insert(out.end(), bytes, bytes + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return out;
}

}  // namespace dtorch::checkpoint
