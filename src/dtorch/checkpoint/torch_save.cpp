// torch.save's file format from C++ without TorchScript's type tags.
#include "dtorch/checkpoint/torch_save.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/frontend/script_type_parser.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "dtorch/core/error.h"

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
  std::vector<char> out;
  append_torch_save(value, out);
  return out;
}

// Note [One checksum per file]
// A zip archive's every record carries a CRC-32 of its bytes, which LibTorch's writer computes
// (about 1 s per GiB on one core, as long as a disk takes to write it) and its reader never
// checks (LibTorch 1.13 and 2.x and Python's torch.load read records whose CRC-32 is zero; zip
// tools such as unzip -t report them). dtorch's checkpoint files carry a CRC-32 of all their
// bytes of their own (the .dtc header's, metadata.json's "files"), checked before anything in
// them is read: computing the records' too was a second pass over every byte a checkpoint
// saves, the slower of the two. Those files leave the records' out where the LibTorch can
// (PyTorchStreamWriter's compute_crc32, from 2.6; Python's
// torch.serialization.set_crc32_options(False)): zeros, which torch.load reads past. Files
// meant for Python and zip tools (model.pt, what `checkpoint consolidate` writes) keep them.

namespace {

// LibTorch's zip writer, handing its bytes to `sink` in order.
std::unique_ptr<caffe2::serialize::PyTorchStreamWriter> zip_writer(
    const std::function<void(const char*, size_t)>& sink, RecordCrcs crcs) {
  auto write = [sink](const void* data, size_t n) {
    sink(static_cast<const char*>(data), n);
    return n;
  };
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  return std::make_unique<caffe2::serialize::PyTorchStreamWriter>(
      write, /*compute_crc32=*/crcs == RecordCrcs::Computed);
#else
  (void)crcs;  // computed always
  return std::make_unique<caffe2::serialize::PyTorchStreamWriter>(write);
#endif
}

// The archive torch.save writes for `value`: `begin` learns about how many bytes will come, then
// `sink` takes them in order.
void write_archive(const c10::IValue& value, RecordCrcs crcs,
                   const std::function<void(size_t)>& begin,
                   const std::function<void(const char*, size_t)>& sink) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t n) { pickle.insert(pickle.end(), buf, buf + n); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();

  // The zip's records: the pickle, each storage aligned to 64 bytes with a local header, the
  // version record and the central directory (a few hundred bytes per record).
  size_t size = pickle.size() + 4096;
  for (const at::Tensor& t : pickler.tensorData())
    size += t.storage().nbytes() + 512;
  begin(size);
  const auto writer = zip_writer(sink, crcs);
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     *writer);
  writer->writeEndOfFile();
}

}  // namespace

void append_torch_save(const c10::IValue& value, std::vector<char>& out, RecordCrcs crcs) {
  write_archive(
      value, crcs, [&](size_t n) { out.reserve(out.size() + n); },
      [&](const char* bytes, size_t n) { out.insert(out.end(), bytes, bytes + n); });
}

void stream_torch_save(const c10::IValue& value, const ByteSink& sink, RecordCrcs crcs) {
  write_archive(
      value, crcs, [](size_t) {}, [&](const char* bytes, size_t n) { sink(bytes, n); });
}

void stream_torch_save_dict(const std::vector<std::pair<std::string, at::Tensor>>& shapes,
                            const StorageStream& fill, const ByteSink& sink, RecordCrcs crcs) {
  // One stand-in per distinct tensor: a CPU tensor of its dtype and shape over a storage of its
  // size and no memory, which the pickler describes (dtype, size, key) without reading it.
  std::map<const c10::TensorImpl*, size_t> key_of_shape;
  std::map<const c10::StorageImpl*, size_t> key_of_stand_in;
  std::vector<at::Tensor> stand_ins;
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, shape] : shapes) {
    auto [it, fresh] = key_of_shape.emplace(shape.unsafeGetTensorImpl(), stand_ins.size());
    if (fresh) {
      const auto bytes = static_cast<size_t>(shape.numel()) * shape.element_size();
      at::Storage storage(at::Storage::use_byte_size_t(), bytes,
                          at::DataPtr(nullptr, at::Device(at::kCPU)), /*allocator=*/nullptr,
                          /*resizable=*/false);
      stand_ins.push_back(at::empty({0}, at::TensorOptions().dtype(shape.scalar_type()))
                              .set_(storage, 0, shape.sizes(), at::IntArrayRef()));
      key_of_stand_in.emplace(storage.unsafeGetStorageImpl(), it->second);
    }
    dict.insert(name, stand_ins[it->second]);
  }
  const auto writer = zip_writer([&](const char* b, size_t n) { sink(b, n); }, crcs);
  // The storages first, as writeArchiveAndTensors writes them, then the pickle that names them.
  size_t next = 0;
  fill([&](size_t k, const at::Tensor& values) {
    if (k != next || k >= stand_ins.size() || !values.is_contiguous() ||
        values.nbytes() != stand_ins[k].storage().nbytes() || !values.device().is_cpu())
      throw std::logic_error(str("storage ", k, " handed out of order or not as its shape says"));
    writer->writeRecord(str("data/", k), values.data_ptr(), values.nbytes());
    ++next;
  });
  if (next != stand_ins.size())
    throw std::logic_error(str(next, " of ", stand_ins.size(), " storages handed"));
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t n) { pickle.insert(pickle.end(), buf, buf + n); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/
      [&](const at::Tensor& t) {
        return std::to_string(key_of_stand_in.at(t.storage().unsafeGetStorageImpl()));
      },
      /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(dict);
  pickler.stop();
  writer->writeRecord("data.pkl", pickle.data(), pickle.size());
  writer->writeEndOfFile();
}

namespace {

uint64_t little_endian(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = v << 8 | p[i];
  return v;
}

// Why the `n` bytes at `bytes` cannot be a whole zip archive, or "": its end-of-central-directory
// record (zip64's too) must be there and its central directory inside the bytes.
std::string zip_archive_problem(const char* bytes, uint64_t n) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes);
  constexpr uint64_t kRecord = 22;  // the end-of-central-directory record without its comment
  if (n < kRecord) return str("holds ", n, " bytes, too few for a zip archive");
  // The record ends the archive, followed only by its comment (at most 65535 bytes).
  const uint64_t lowest = n > kRecord + 65535 ? n - kRecord - 65535 : 0;
  uint64_t at = n - kRecord;
  while (!(little_endian(b + at, 4) == 0x06054b50 &&
           at + kRecord + little_endian(b + at + 20, 2) == n)) {
    if (at == lowest)
      return "has no end-of-central-directory record (a truncated file, or not a zip archive)";
    --at;
  }
  uint64_t size = little_endian(b + at + 12, 4), offset = little_endian(b + at + 16, 4);
  uint64_t end = at;
  if (size == 0xFFFFFFFF || offset == 0xFFFFFFFF || little_endian(b + at + 10, 2) == 0xFFFF) {
    // zip64: a 20-byte locator before the record points to the 56-byte zip64 record.
    if (at < 20 || little_endian(b + at - 20, 4) != 0x07064b50) return "lacks its zip64 locator";
    const uint64_t record = little_endian(b + at - 12, 8);
    if (record > at - 20 || at - 20 - record < 56 || little_endian(b + record, 4) != 0x06064b50)
      return "has its zip64 record outside the file (truncated?)";
    size = little_endian(b + record + 40, 8);
    offset = little_endian(b + record + 48, 8);
    end = record;
  }
  if (offset > end || size > end - offset)
    return str("has its central directory (", size, " bytes at ", offset, ") outside its ", n,
               " bytes (truncated?)");
  return "";
}

constexpr size_t kMaxTypeTag = 1024;
constexpr int kMaxTypeDepth = 16;

// type := plain | generic "[" type (", " type)* "]", at most kMaxTypeDepth deep.
bool parse_plain_type(const std::string& s, size_t& at, int depth) {
  static const std::set<std::string> plain = {"Any",     "Device", "NoneType", "Tensor", "bool",
                                              "complex", "float",  "int",      "str"};
  static const std::set<std::string> generic = {"Dict", "List", "Optional", "Tuple", "Union"};
  if (depth > kMaxTypeDepth) return false;
  const size_t start = at;
  while (at < s.size() && std::isalpha(static_cast<unsigned char>(s[at])))
    ++at;
  const std::string name = s.substr(start, at - start);
  if (plain.count(name)) return true;
  if (!generic.count(name) || at == s.size() || s[at] != '[') return false;
  ++at;
  for (;;) {
    if (!parse_plain_type(s, at, depth + 1)) return false;
    if (s.compare(at, 2, ", ") == 0) {
      at += 2;
    } else if (at < s.size() && s[at] == ']') {
      ++at;
      return true;
    } else {
      return false;
    }
  }
}

// The unpickler's type resolver (Note [Reading untrusted archives]).
c10::StrongTypePtr resolve_type_tag(const c10::QualifiedName& name) {
  static const auto unit = std::make_shared<torch::jit::CompilationUnit>();
  const std::string tag = name.qualifiedName();
  size_t at = 0;
  if (tag.size() > kMaxTypeTag || !parse_plain_type(tag, at, 0) || at != tag.size())
    throw UnreadableArchive(str("names the type \"", tag.substr(0, 60),
                                tag.size() > 60 ? "..." : "",
                                "\", which is neither a plain type (such as Dict[str, Tensor]) "
                                "nor one dtorch reads"));
  return c10::StrongTypePtr(unit, torch::jit::ScriptTypeParser().parseType(tag));
}

// A type as a module's code names it: Tensor, int, a submodule's mangled name, List[Tensor].
bool type_text(const std::string& s) {
  if (s.empty() || s.size() > kMaxTypeTag ||
      !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_'))
    return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_.[], ", c) != nullptr;
  });
}

// A double-quoted name without escapes at `at`; moves `at` past it.
bool quoted_name(const std::string& s, size_t& at) {
  if (at >= s.size() || s[at] != '"') return false;
  const size_t end = s.find_first_of("\"\\", at + 1);
  if (end == std::string::npos || s[end] != '"') return false;
  at = end + 1;
  return true;
}

bool starts(const std::string& s, const char* prefix, size_t& at) {
  const size_t n = std::strlen(prefix);
  if (s.compare(0, n, prefix) != 0) return false;
  at = n;
  return true;
}

// One line of a module's code as OutputArchive writes it: the class line; its parameter and
// buffer names (`__parameters__ = ["params/size", ]`); its attributes and their types, as
// `name : Type` or `__annotations__["name"] = Type` (with `__annotations__ = []` before); or
// nothing.
bool attribute_module_line(const std::string& line) {
  if (line.empty() || line == "class Module(Module):" || line == "  __annotations__ = []")
    return true;
  size_t at = 0;
  if (starts(line, "  __parameters__ = [", at) || starts(line, "  __buffers__ = [", at)) {
    while (at < line.size() && line[at] == '"') {
      if (!quoted_name(line, at) || line.compare(at, 2, ", ") != 0) return false;
      at += 2;
    }
    return at + 1 == line.size() && line[at] == ']';
  }
  if (starts(line, "  __annotations__[", at))
    return quoted_name(line, at) && line.compare(at, 4, "] = ") == 0 &&
           type_text(line.substr(at + 4));
  const size_t colon = line.find(" : ");
  if (line.compare(0, 2, "  ") != 0 || colon == std::string::npos || colon == 2) return false;
  const std::string name = line.substr(2, colon - 2);
  return std::all_of(
             name.begin(), name.end(),
             [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }) &&
         type_text(line.substr(colon + 3));
}

}  // namespace

// Note [Reading untrusted archives]
// A file given to dtorch may be damaged or hostile, and three things in it crash LibTorch's
// reader instead of making it throw, so all are checked before it sees them. A zip archive that is
// not whole: LibTorch 1.13's reader reads outside the buffer (AddressSanitizer:
// heap-buffer-overflow in mz_zip_reader_init). A container's type tag
// (torch.jit._pickle.restore_type_tag(value, "Dict[str, Tensor]"), which torch::pickle_save
// writes): the unpickler hands the string to TorchScript's parser, whose recursive descent has no
// depth limit and which crashed on a damaged tag (SIGSEGV in LibTorch 1.13's ScriptTypeParser).
// torch::pickle_load takes no type parser, so this is pickle_load with a type resolver of our own
// that lets through only plain types (builtin names, generics over them, 16 deep) before
// TorchScript parses them. It also receives the names of classes an archive asks for, which it
// refuses as pickle_load does. And the code of a TorchScript module (a checkpoint's optimizer
// state, which torch::serialize::InputArchive reads as one): TorchScript compiles each class in it,
// and a damaged class line crashed its compiler (SIGSEGV in ScriptTypeParser::parseClassConstant,
// LibTorch 1.13). What torch::serialize writes is modules of typed attributes and nothing
// else, so check_serialize_archive lets through only those lines.
c10::IValue load_torch_save(const std::vector<char>& bytes) {
  const std::string problem = zip_archive_problem(bytes.data(), bytes.size());
  if (!problem.empty()) throw UnreadableArchive(problem);
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), bytes.size()));
  return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                           resolve_type_tag, /*obj_loader=*/c10::nullopt,
                                           /*device=*/c10::nullopt, reader);
}

c10::IValue load_torch_save_in_place(std::shared_ptr<char> bytes, size_t n) {
  const std::string problem = zip_archive_problem(bytes.get(), n);
  if (!problem.empty()) throw UnreadableArchive(problem);
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.get(), n));
  auto [pickle, pickle_bytes] = reader.getRecord("data.pkl");
  size_t done = 0;
  // A copy, not the binding: C++17 lets no lambda capture a structured binding.
  const auto read = [&, data = static_cast<const char*>(pickle.get()), pickle_size = pickle_bytes](
                        char* out, size_t len) {
    len = std::min(pickle_size - done, len);
    std::memcpy(out, data + done, len);
    done += len;
    return len;
  };
  // Each storage is its record in place, holding the bytes alive (what readArchiveAndTensors
  // does with a copy of every record).
  const auto in_place = [&](const std::string& key) {
    char* record = bytes.get() + reader.getRecordOffset("data/" + key);
    return at::DataPtr(
        record, new std::shared_ptr<char>(bytes),
        [](void* keep) { delete static_cast<std::shared_ptr<char>*>(keep); }, at::kCPU);
  };
  torch::jit::Unpickler unpickler(read, resolve_type_tag, /*obj_loader=*/nullptr, in_place,
                                  /*device=*/c10::nullopt);
  unpickler.set_version(reader.version());
  c10::IValue value = unpickler.parse_ivalue();
  // The pickle gives each storage's size: it must end inside the bytes.
  bool inside = true;
  value.visit([&](const c10::IValue& v) {
    if (v.isTensor()) {
      const at::Storage& storage = v.toTensor().storage();
      const auto begin = reinterpret_cast<uintptr_t>(storage.data());
      const auto base = reinterpret_cast<uintptr_t>(bytes.get());
      inside &= storage.nbytes() == 0 ||  // an empty storage may point anywhere, or nowhere
                (begin >= base && begin - base <= n && storage.nbytes() <= n - (begin - base));
    }
    return false;
  });
  if (!inside) throw UnreadableArchive("has a tensor whose storage runs past the end of the file");
  return value;
}

void check_serialize_archive(const std::string& bytes) {
  const std::string problem = zip_archive_problem(bytes.data(), bytes.size());
  if (!problem.empty()) throw UnreadableArchive(problem);
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), bytes.size()));
  for (const std::string& name : reader.getAllRecords()) {
    const size_t code = name.find("code/");
    if (code == std::string::npos || name.size() < 3 ||
        name.compare(name.size() - 3, 3, ".py") != 0)
      continue;
    auto [data, size] = reader.getRecord(name);
    std::istringstream text(std::string(static_cast<const char*>(data.get()), size));
    for (std::string line; std::getline(text, line);)
      if (!attribute_module_line(line))
        throw UnreadableArchive(str("holds code (", name.substr(code), ") that is not a module of ",
                                    "attributes, as torch::serialize writes"));
  }
}

}  // namespace dtorch::checkpoint
