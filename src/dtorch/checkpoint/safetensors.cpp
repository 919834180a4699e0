// safetensors writing and reading, checked the way the safetensors package checks a file:
// byte ranges in order, without holes or overlaps, each the size its dtype and shape say.
#include "dtorch/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/error.h"
#include "dtorch/core/json_config.h"

namespace dtorch::checkpoint {
namespace {

using Json = nlohmann::ordered_json;

// The 8-byte prefix is the header's length; safetensors refuses headers above 100 MB.
constexpr uint64_t kMaxHeader = 100'000'000;

const std::vector<std::pair<at::ScalarType, const char*>>& dtype_names() {
  static const std::vector<std::pair<at::ScalarType, const char*>> names = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
      {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
      {at::kByte, "U8"},    {at::kBool, "BOOL"}};
  return names;
}

uint64_t read_le64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

namespace {

// The 8-byte length and the JSON header of a file holding `state` in its order, and the bytes
// its data takes; only the tensors' dtypes and shapes are read (meta tensors do).
std::string header_of(const StateDict& state,
                      const std::vector<std::pair<std::string, std::string>>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata)
      m[k] = v;
    header["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : state) {
    const auto type = tensor.scalar_type();  // a lambda may not capture a binding in clang 14
    auto it = std::find_if(dtype_names().begin(), dtype_names().end(),
                           [&](const auto& e) { return e.first == type; });
    DTORCH_CHECK_T(CheckpointError, it != dtype_names().end(), "safetensors has no dtype for ",
                   name, " (", tensor.scalar_type(), "); save it as .pt instead");
    DTORCH_CHECK_T(CheckpointError, !header.contains(name), "state dict key ", name,
                   " appears twice");
    const auto n = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
    header[name] = {{"dtype", it->second},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  // The data that follows starts 8-byte aligned, as the safetensors package writes it.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  std::string out;
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff));
  return out + text;
}

}  // namespace

std::vector<char> safetensors_bytes(
    const StateDict& state, const std::vector<std::pair<std::string, std::string>>& metadata) {
  const std::string header = header_of(state, metadata);
  std::vector<char> out(header.begin(), header.end());
  for (const auto& [name, tensor] : state) {
    const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const char* p = static_cast<const char*>(t.data_ptr());
    out.insert(out.end(), p, p + t.nbytes());
  }
  return out;
}

void stream_safetensors(const StateDict& shapes, const StorageStream& fill, const ByteSink& sink) {
  const std::string header = header_of(shapes, {});
  sink(header.data(), header.size());
  size_t next = 0;
  fill([&](size_t k, const at::Tensor& values) {
    if (k != next || k >= shapes.size() || !values.is_contiguous() ||
        values.sizes() != shapes[k].second.sizes() ||
        values.scalar_type() != shapes[k].second.scalar_type() || !values.device().is_cpu())
      throw std::logic_error(str("tensor ", k, " handed out of order or not as its shape says"));
    sink(static_cast<const char*>(values.data_ptr()), values.nbytes());
    ++next;
  });
  if (next != shapes.size())
    throw std::logic_error(str(next, " of ", shapes.size(), " tensors handed"));
}

bool looks_like_safetensors(const std::vector<char>& bytes) {
  if (bytes.size() < 9) return false;
  const uint64_t n = read_le64(bytes.data());
  return n >= 2 && n <= kMaxHeader && n <= bytes.size() - 8 && bytes[8] == '{';
}

StateDict parse_safetensors(const std::vector<char>& bytes, const std::string& source) {
  DTORCH_CHECK_T(CheckpointError, looks_like_safetensors(bytes), source,
                 " is not a safetensors file (too short, or no JSON header after the 8-byte "
                 "length); was it cut short?");
  const uint64_t n = read_le64(bytes.data());
  Json header;
  try {
    header = Json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  } catch (const std::exception& e) {
    DTORCH_FAIL(CheckpointError, source, ": the safetensors header is not valid JSON: ", e.what());
  }
  DTORCH_CHECK_T(CheckpointError, header.is_object(), source,
                 ": the safetensors header is not a JSON object");
  const char* base = bytes.data() + 8 + n;
  const uint64_t buffer = bytes.size() - 8 - n;

  struct Entry {
    uint64_t begin, end;
    std::string name;
    at::Tensor tensor;
  };
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    std::string where = str(source, ": tensor ", name);
    DTORCH_CHECK_T(CheckpointError,
                   info.is_object() && info.contains("dtype") && info.contains("shape") &&
                       info.contains("data_offsets") && info["data_offsets"].size() == 2,
                   where, " lacks dtype, shape or data_offsets");
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;
    try {
      dtype = info.at("dtype").get<std::string>();
      if (!info.at("shape").is_array()) throw std::runtime_error("\"shape\" is not a list");
      for (const auto& d : info.at("shape"))
        shape.push_back(json_config::whole_number<int64_t>(d, "a dimension of \"shape\""));
      begin = json_config::whole_number<uint64_t>(info.at("data_offsets").at(0), "a data offset");
      end = json_config::whole_number<uint64_t>(info.at("data_offsets").at(1), "a data offset");
    } catch (const std::exception& e) {
      DTORCH_FAIL(CheckpointError, where, " is malformed (", json_config::reason(e),
                  "); the file is truncated or corrupt");
    }
    auto it = std::find_if(dtype_names().begin(), dtype_names().end(),
                           [&](const auto& e) { return dtype == e.second; });
    DTORCH_CHECK_T(CheckpointError, it != dtype_names().end(), where, " has dtype ", dtype,
                   ", which dtorch does not read");
    // The shape is checked against the bytes there are before anything is allocated for it.
    const auto item = static_cast<int64_t>(c10::elementSize(it->first));
    const int64_t elements = elements_within(shape, static_cast<int64_t>(buffer) / item);
    const uint64_t need = elements < 0 ? 0 : static_cast<uint64_t>(elements * item);
    DTORCH_CHECK_T(
        CheckpointError, elements >= 0 && begin <= end && end <= buffer && end - begin == need,
        where, " has bytes [", begin, ", ", end, ") but its shape ", c10::IntArrayRef(shape),
        " and dtype ", dtype, " need ", elements < 0 ? "more" : std::to_string(need),
        " within a data section of ", buffer, " bytes; the file is truncated or corrupt");
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(it->first));
    if (need > 0) std::memcpy(t.data_ptr(), base + begin, need);
    entries.push_back({begin, end, name, t});
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t at = 0;
  StateDict out;
  for (auto& e : entries) {
    DTORCH_CHECK_T(CheckpointError, e.begin == at, source, ": tensor ", e.name, " starts at byte ",
                   e.begin, " where ", at, " was expected (overlapping or missing bytes)");
    at = e.end;
    out.emplace_back(e.name, e.tensor);
  }
  DTORCH_CHECK_T(CheckpointError, at == buffer, source, ": ", buffer - at,
                 " bytes after the last tensor belong to none");
  return out;
}

}  // namespace dtorch::checkpoint
