// Tests for state dicts: round trip, errors naming missing/unexpected keys and shape
// mismatches, atomic writes, and files that PyTorch's torch.load + load_state_dict accept.
#include "dtorch/checkpoint/state_dict.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "dtorch/checkpoint/crc32.h"
#include "dtorch/checkpoint/safetensors.h"
#include "dtorch/checkpoint/torch_save.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/models/registry.h"
#include "models/python_peer.h"
#include "support/workers.h"

namespace dtorch::checkpoint {
namespace {

void expect_same_state(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto sa = state_dict(a), sb = state_dict(b);
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_TRUE(torch::equal(sa[i].second, sb[i].second)) << sa[i].first;
  }
}

std::vector<std::string> files_in(const std::string& dir) {
  return paths::list_directory(dir);
}

TEST(StateDict, RoundTrip) {
  auto dir = dtorch::testing::scratch_dir("state-dict-roundtrip");
  auto a = models::make_model("mnist-cnn");
  auto b = models::make_model("mnist-cnn");
  save_state_dict(*a, dir + "/m.pt");
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"m.pt"}) << "no temporary left behind";
  load_state_dict(*b, dir + "/m.pt");
  expect_same_state(*a, *b);
  // Loaded values are copies, not aliases of the file's tensors or of `a`.
  torch::NoGradGuard g;
  b->parameters()[0].add_(1);
  EXPECT_FALSE(torch::equal(a->parameters()[0], b->parameters()[0]));
}

TEST(StateDict, BuffersTravelToo) {
  auto dir = dtorch::testing::scratch_dir("state-dict-buffers");
  torch::nn::BatchNorm1d a(4), b(4);
  {
    torch::NoGradGuard g;
    a->running_mean.fill_(3);
  }
  save_state_dict(*a, dir + "/bn.pt");
  load_state_dict(*b, dir + "/bn.pt");
  EXPECT_TRUE(torch::equal(b->running_mean, a->running_mean));
}

TEST(StateDict, MismatchNamesKeysAndShapesAndChangesNothing) {
  auto dir = dtorch::testing::scratch_dir("state-dict-mismatch");
  auto mlp = models::make_model("mnist-mlp");
  auto cnn = models::make_model("mnist-cnn");
  auto before = cnn->parameters()[0].clone();
  save_state_dict(*mlp, dir + "/mlp.pt");
  try {
    load_state_dict(*cnn, dir + "/mlp.pt");
    FAIL();
  } catch (const CheckpointError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("mlp.pt"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing keys: conv1.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected keys: fc3.weight, fc3.bias"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fc1.weight (saved [256, 784], model [128, 9216])"), std::string::npos)
        << msg;
  }
  EXPECT_TRUE(torch::equal(cnn->parameters()[0], before));
}

TEST(StateDict, UnreadableFilesAreCheckpointErrors) {
  auto dir = dtorch::testing::scratch_dir("state-dict-bad");
  auto m = models::make_model("mnist-mlp");
  EXPECT_THROW(load_state_dict(*m, dir + "/absent.pt"), CheckpointError);
  std::ofstream(dir + "/junk.pt") << "not a pickle";
  EXPECT_THROW(load_state_dict(*m, dir + "/junk.pt"), CheckpointError);
  // A pickle of something other than a dict of tensors.
  auto bytes = torch::pickle_save(c10::IValue(int64_t{7}));
  std::ofstream(dir + "/int.pt", std::ios::binary).write(bytes.data(), bytes.size());
  EXPECT_THROW(load_state_dict(*m, dir + "/int.pt"), CheckpointError);
  // A truncated file is refused before LibTorch's reader, which reads outside a truncated
  // archive's buffer (found by tests/fuzz/torch_save_fuzz).
  save_state_dict(*m, dir + "/whole.pt");
  auto whole = read_file(dir + "/whole.pt");
  whole.resize(whole.size() / 2);
  std::ofstream(dir + "/half.pt", std::ios::binary).write(whole.data(), whole.size());
  try {
    load_state_dict(*m, dir + "/half.pt");
    ADD_FAILURE() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("half.pt is not a readable state dict: it has no "
                                         "end-of-central-directory record"),
              std::string::npos)
        << e.what();
  }
}

// torch.save's container around a hand-written pickle of restore_type_tag({}, tag): the empty
// dict that TorchScript's pickler tags with its type.
std::vector<char> tagged_empty_dict(const std::string& tag) {
  std::string pickle =
      "\x80\x02"  // protocol 2
      "ctorch.jit._pickle\nrestore_type_tag\n(}X";
  for (int i = 0; i < 4; ++i)
    pickle += static_cast<char>((tag.size() >> (8 * i)) & 0xff);
  pickle += tag + "tR.";
  std::vector<char> out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    out.insert(out.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeEndOfFile();
  return out;
}

// Note [Reading untrusted archives]: a damaged type tag crashed TorchScript's type parser
// (found by FuzzSmoke in a .dtc payload); plain tags, as torch::pickle_save writes, still load.
TEST(StateDict, TypeTagsArePlainTypesOrRefused) {
  const auto tagged = torch::pickle_save(c10::IValue(c10::Dict<std::string, torch::Tensor>()));
  EXPECT_TRUE(unpickle_state_dict(tagged, "tagged.pt").empty());
  EXPECT_TRUE(unpickle_state_dict(tagged_empty_dict("Dict[str, Tensor]"), "plain.pt").empty());
  std::string deep;
  for (int i = 0; i < 20000; ++i)
    deep += "List[";
  deep += "int" + std::string(20000, ']');
  for (const std::string& tag : {deep, std::string("Dict[str, Tensor"),
                                 std::string("Dict[str, Final[int]]"), std::string("a.b")}) {
    try {
      unpickle_state_dict(tagged_empty_dict(tag), "bad.pt");
      ADD_FAILURE() << "no error for " << tag.substr(0, 40);
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("bad.pt is not a readable state dict: it names the "
                                           "type \"" +
                                           tag.substr(0, 20)),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(StateDict, FailedWriteKeepsThePreviousFile) {
  auto dir = dtorch::testing::scratch_dir("state-dict-atomic");
  write_file_atomically(dir + "/f", {'o', 'l', 'd'});
  // A directory where the temporary would go makes the write fail.
  paths::create_directory(dir + "/f." + std::to_string(::getpid()) + ".tmp");
  EXPECT_THROW(write_file_atomically(dir + "/f", {'n', 'e', 'w'}), CheckpointError);
  EXPECT_EQ(read_file(dir + "/f"), (std::vector<char>{'o', 'l', 'd'}));
  EXPECT_THROW(write_file_atomically(dir + "/no/such/dir/f", {'x'}), CheckpointError);
}

// An SGD optimizer's state as a checkpoint holds it (torch::serialize's module archive), with
// `edit` applied to the text of each of its code records.
std::string optimizer_archive(const std::function<void(std::string&)>& edit) {
  torch::nn::Linear model(3, 2);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  model(torch::ones({1, 3})).sum().backward();
  opt.step();
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream saved;
  archive.save_to(saved);
  const std::string bytes = saved.str();
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), bytes.size()));
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  for (const std::string& name : reader.getAllRecords()) {
    // The writer adds its own of these.
    if (name == "version" || name == ".data/version" || name == "byteorder" ||
        name == ".data/serialization_id")
      continue;
    auto [data, size] = reader.getRecord(name);
    std::string record(static_cast<const char*>(data.get()), size);
    if (name.find("code/") != std::string::npos && name.size() > 3 &&
        name.compare(name.size() - 3, 3, ".py") == 0)
      edit(record);
    writer.writeRecord(name, record.data(), record.size());
  }
  writer.writeEndOfFile();
  return out;
}

// Note [Reading untrusted archives]: an optimizer archive as torch::serialize writes it passes
// and loads; one whose module code was damaged (a mutation that crashed TorchScript's compiler
// in LibTorch 1.13) is refused before TorchScript sees it.
TEST(StateDict, OptimizerArchivesHoldOnlyModulesOfAttributes) {
  const std::string plain = optimizer_archive([](std::string&) {});
  EXPECT_NO_THROW(check_serialize_archive(plain));
  torch::serialize::InputArchive archive;
  std::istringstream in(plain);
  EXPECT_NO_THROW(archive.load_from(in));
  int edited = 0;
  const std::string damaged = optimizer_archive([&](std::string& code) {
    const size_t at = code.find("__parameters__");
    if (at == std::string::npos || edited++) return;
    code[at + 9] = '9';  // "__paramet9rs__ = []"
  });
  ASSERT_GE(edited, 1);
  try {
    check_serialize_archive(damaged);
    ADD_FAILURE() << "a damaged module archive was accepted";
  } catch (const UnreadableArchive& e) {
    EXPECT_NE(std::string(e.what()).find("not a module of attributes"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(check_serialize_archive(plain.substr(0, plain.size() / 2)), UnreadableArchive);
}

// CRC-32 a bit at a time, from its definition (reflected, polynomial 0xEDB88320), as zlib's
// crc32 and Python's zlib.crc32 continue `start`.
uint32_t bitwise_crc32(uint32_t start, const uint8_t* p, size_t n) {
  uint32_t c = ~start;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int bit = 0; bit < 8; ++bit)
      c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// Note [Folded CRC-32]: every length (the folds of 64 and 16 bytes and each tail), alignment
// and running value gives the checksum the definition does; a known value pins it to zlib's.
TEST(Crc32, EveryLengthOffsetAndStartIsTheDefinitions) {
  std::mt19937 gen(3);
  std::vector<uint8_t> bytes(4096 + 16);
  for (auto& b : bytes)
    b = static_cast<uint8_t>(gen());
  for (size_t offset : {0, 1, 7, 8, 15})
    for (size_t n = 0; n <= 300; ++n)
      for (uint32_t start : {0u, 0xFFFFFFFFu, 0x9E3779B9u})
        ASSERT_EQ(crc32_update(start, bytes.data() + offset, n),
                  bitwise_crc32(start, bytes.data() + offset, n))
            << "offset " << offset << ", " << n << " bytes, start " << start;
  EXPECT_EQ(crc32_of(bytes.data(), 4096), bitwise_crc32(0, bytes.data(), 4096));
  // Split anywhere, continued: the whole's.
  for (size_t cut : {0, 1, 63, 64, 65, 1000, 4096})
    EXPECT_EQ(crc32_update(crc32_of(bytes.data(), cut), bytes.data() + cut, 4096 - cut),
              crc32_of(bytes.data(), 4096))
        << cut;
  const char* text = "123456789";  // the CRC-32 check value
  EXPECT_EQ(crc32_of(text, 9), 0xCBF43926u);
}

// A shard file is streamed to disk: the same bytes as pickled whole, the CRC continued over the
// pieces, and a failure part way leaves the previous file and no temporary.
TEST(StateDict, StreamedFileIsThePickledOneAndFailsWhole) {
  StateDict state = {{"a", torch::arange(1000, torch::kFloat)}, {"b", torch::ones({3, 5})}};
  std::vector<char> whole = pickle_state_dict(state), streamed;
  uint32_t crc = crc32_of(nullptr, 0);
  stream_state_dict(
      state,
      [&](const char* data, size_t n) {
        streamed.insert(streamed.end(), data, data + n);
        crc = crc32_update(crc, data, n);
        return true;
      },
      RecordCrcs::Computed);
  EXPECT_TRUE(streamed == whole);
  EXPECT_EQ(crc, crc32_of(whole.data(), whole.size()));

  auto dir = dtorch::testing::scratch_dir("state-dict-stream");
  write_file_atomically(dir + "/f", {'o', 'l', 'd'});
  EXPECT_THROW(dtorch::write_file_atomically(dir + "/f",
                                             [](const ByteSink& sink) {
                                               sink("ne", 2);
                                               throw std::runtime_error("serializer failed");
                                             }),
               std::runtime_error);
  EXPECT_EQ(read_file(dir + "/f"), (std::vector<char>{'o', 'l', 'd'}));
  EXPECT_EQ(paths::list_directory(dir), std::vector<std::string>{"f"}) << "a temporary is left";
}

std::vector<char> streamed_bytes(const StateDict& state, RecordCrcs crcs) {
  std::vector<char> out;
  stream_state_dict(
      state,
      [&](const char* data, size_t n) {
        out.insert(out.end(), data, data + n);
        return true;
      },
      crcs);
  return out;
}

// Note [One checksum per file]: a checkpoint's archive leaves its records' CRC-32 out (zeros)
// where LibTorch can, and reads back alike (Python's torch.load too: PythonLoadsItIntoThePeer).
TEST(StateDict, RecordsWithoutTheirCrcReadBackAlike) {
  StateDict state = {{"a", torch::arange(1000, torch::kFloat)}, {"b", torch::ones({3, 5})}};
  const std::vector<char> with = streamed_bytes(state, RecordCrcs::Computed);
  const std::vector<char> without = streamed_bytes(state, RecordCrcs::LeftOut);
  ASSERT_EQ(without.size(), with.size());
  // Each record's CRC-32 as the central directory lists it (bytes 16-19 of each 46-byte entry,
  // which a name, an extra field and a comment follow), for the records that hold bytes.
  const auto* b = reinterpret_cast<const unsigned char*>(without.data());
  const auto le = [&](size_t at, int n) {
    uint32_t v = 0;
    for (int i = n - 1; i >= 0; --i)
      v = v << 8 | b[at + i];
    return v;
  };
  const size_t end = without.size() - 22;  // the end-of-central-directory record, no comment
  ASSERT_EQ(le(end, 4), 0x06054b50u);
  std::vector<uint32_t> crcs;
  for (size_t at = le(end + 16, 4); at < end && le(at, 4) == 0x02014b50u;
       at += 46 + le(at + 28, 2) + le(at + 30, 2) + le(at + 32, 2))
    if (le(at + 24, 4) > 0) crcs.push_back(le(at + 16, 4));
  ASSERT_GE(crcs.size(), 3u) << "data.pkl and the two storages at least";
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  EXPECT_EQ(crcs, std::vector<uint32_t>(crcs.size(), 0)) << "the records' CRC-32 was computed";
#else
  for (uint32_t crc : crcs)
    EXPECT_NE(crc, 0u) << "before 2.6 LibTorch computes every record's CRC-32";
#endif
  const StateDict back = unpickle_state_dict(without, "without");
  ASSERT_EQ(back.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back[i].first, state[i].first);
    EXPECT_TRUE(torch::equal(back[i].second, state[i].second)) << back[i].first;
  }
}

// Note [Model files written as they are gathered]: a state dict written from its shapes, its
// tensors handed one at a time, is the file written whole: the same tensors, tied ones still one
// storage; the same safetensors bytes.
std::vector<char> gathered_bytes(const StateDict& state, SaveFormat format,
                                 const std::function<void(const TakeTensor&)>& fill) {
  std::vector<char> out;
  stream_state_dict(shapes_of(state), format, fill, [&](const char* data, size_t n) {
    out.insert(out.end(), data, data + n);
    return true;
  });
  return out;
}

TEST(StateDict, GatheredFileIsTheWholeOne) {
  const torch::Tensor tied = torch::randn({4, 3});
  const StateDict state = {{"wte", tied},
                           {"lm_head", tied},
                           {"half", torch::randn({5}).to(torch::kBFloat16)},
                           {"count", torch::arange(7, torch::kLong)}};
  const auto in_turn = [&](const TakeTensor& take) {
    for (const char* name : {"wte", "half", "count"})
      for (const auto& [n, t] : state)
        if (n == name) take(n, t.clone());  // a copy each: only the values travel
  };
  const StateDict got =
      unpickle_state_dict(gathered_bytes(state, SaveFormat::Torch, in_turn), "gathered");
  ASSERT_EQ(got.size(), state.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, state[i].first);
    EXPECT_TRUE(torch::equal(got[i].second, state[i].second)) << got[i].first;
  }
  EXPECT_EQ(got[0].second.data_ptr(), got[1].second.data_ptr()) << "tied weights split";

  const StateDict untied = {state[0], state[2], state[3]};
  EXPECT_EQ(gathered_bytes(untied, SaveFormat::Safetensors, in_turn), safetensors_bytes(untied));

  // A tensor handed out of order, of another shape, or not at all is the writer's bug, caught.
  EXPECT_THROW(gathered_bytes(state, SaveFormat::Torch,
                              [&](const TakeTensor& take) { take("half", state[2].second); }),
               std::logic_error);
  EXPECT_THROW(gathered_bytes(untied, SaveFormat::Safetensors,
                              [&](const TakeTensor& take) {
                                take("wte", torch::zeros({3, 4}));
                              }),
               std::logic_error);
  EXPECT_THROW(
      gathered_bytes(state, SaveFormat::Torch, [&](const TakeTensor& take) { take("wte", tied); }),
      std::logic_error);
}

// A mapped file's tensors are its records in place: the same values, inside the mapping, alive
// after the file's handle is gone; a storage the pickle makes longer than the file is refused.
TEST(StateDict, MappedFileIsReadInPlace) {
  auto dir = dtorch::testing::scratch_dir("state-dict-mapped");
  const StateDict state = {{"a", torch::arange(1000, torch::kFloat)}, {"b", torch::ones({3, 5})}};
  write_file_atomically(dir + "/f.pt", pickle_state_dict(state));
  StateDict got;
  {
    const MappedFile file = map_file(dir + "/f.pt");
    got = unpickle_state_dict(file, "f.pt");
    for (const auto& [name, t] : got) {
      const auto* at = static_cast<const char*>(t.data_ptr());
      EXPECT_TRUE(at >= file.bytes.get() && at + t.nbytes() <= file.bytes.get() + file.size)
          << name << " was copied";
    }
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(torch::equal(got[0].second, state[0].second));
  EXPECT_TRUE(torch::equal(got[1].second, state[1].second));

  // "a"'s storage holds 1000 floats, pickled as BININPUT2 1000 (M e8 03): made 65535.
  std::vector<char> bytes = read_file(dir + "/f.pt");
  const std::string size = "M\xe8\x03";
  auto it = std::search(bytes.begin(), bytes.end(), size.begin(), size.end());
  ASSERT_NE(it, bytes.end());
  it[1] = it[2] = '\xff';
  write_file_atomically(dir + "/long.pt", bytes);
  try {
    unpickle_state_dict(map_file(dir + "/long.pt"), "long.pt");
    ADD_FAILURE() << "a storage past the end of the file was read";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("runs past the end of the file"), std::string::npos)
        << e.what();
  }
}

TEST(StateDict, PythonLoadsItIntoThePeerStrictly) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/true);
  auto dir = dtorch::testing::scratch_dir("state-dict-python");
  auto cnn = models::make_model("mnist-cnn");
  auto mlp = models::make_model("mnist-mlp");
  save_state_dict(*cnn, dir + "/cnn.pt");
  save_state_dict(*mlp, dir + "/mlp.pt");
  // As a checkpoint writes it, without its records' CRC-32 (Note [One checksum per file]).
  write_file_atomically(dir + "/cnn-checkpoint.pt",
                        streamed_bytes(state_dict(*cnn), RecordCrcs::LeftOut));
  // As a model file gathered while it is written (Note [Model files written as they are
  // gathered]).
  write_file_atomically(
      dir + "/cnn-gathered.pt",
      gathered_bytes(state_dict(*cnn), SaveFormat::Torch, [&](const TakeTensor& take) {
        for (const auto& [name, t] : state_dict(*cnn))
          take(name, t);
      }));
  std::string out;
  int rc = dtorch::testing::run_python(dir, "load", R"PY(
for cls, f in ((peer.Net, "cnn.pt"), (peer.MLP, "mlp.pt"), (peer.Net, "cnn-checkpoint.pt"),
                (peer.Net, "cnn-gathered.pt")):
    # Note [Files torch.load reads]: the safe loader (the default from PyTorch 2.6) too.
    sd = torch.load(f, weights_only=True)
    assert type(sd) is dict, type(sd)
    net = cls()
    print(net.load_state_dict(sd, strict=True))
    assert list(sd.keys()) == list(net.state_dict().keys()), (list(sd.keys()), f)
# And the other way: a state dict saved by PyTorch, for the C++ side to read.
# (a plain dict: LibTorch 1.13 cannot unpickle state_dict()'s OrderedDict).
sd = peer.MLP().state_dict()
torch.save(dict(sd), "from_python.pt")
torch.save(sd, "ordered_dict.pt")
print(json.dumps(sd["fc3.bias"].tolist()))
)PY",
                                       {}, &out);
  ASSERT_EQ(rc, 0) << out;
  auto fresh = models::make_model("mnist-mlp");
  load_state_dict(*fresh, dir + "/from_python.pt");
  auto expected = nlohmann::json::parse(out.substr(out.rfind('['))).get<std::vector<float>>();
  torch::Tensor bias = fresh->named_parameters()["fc3.bias"];
  ASSERT_EQ(bias.numel(), 10);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(bias[i].item<float>(), expected[i]) << i;
  // The OrderedDict form gives an error that says how to save instead.
  try {
    load_state_dict(*fresh, dir + "/ordered_dict.pt");
    ADD_FAILURE() << "LibTorch now reads OrderedDict state dicts: drop the hint";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("dict(model.state_dict())"), std::string::npos)
        << e.what();
  }
}

TEST(StateDict, SafetensorsRoundTripAndDamagedFiles) {
  auto dir = dtorch::testing::scratch_dir("state-dict-safetensors");
  auto a = models::make_model("mnist-cnn");
  auto b = models::make_model("mnist-cnn");
  save_state_dict(*a, dir + "/m.safetensors", SaveFormat::Safetensors);
  load_state_dict(*b, dir + "/m.safetensors");  // the format is recognised from the bytes
  expect_same_state(*a, *b);

  // Every dtype safetensors has, in state order, any shape (a scalar, an empty tensor).
  StateDict mixed = {{"d", torch::arange(3, torch::kDouble)},
                     {"h", torch::ones({2, 2}, torch::kHalf)},
                     {"bf", torch::full({1}, 1.5, torch::kBFloat16)},
                     {"l", torch::tensor(int64_t{7})},
                     {"u8", torch::tensor({1, 2}, torch::kByte)},
                     {"flag", torch::tensor({true, false})},
                     {"empty", torch::zeros({0, 4})}};
  auto bytes = safetensors_bytes(mixed, {{"format", "pt"}});
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i)
    header = (header << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + header) % 8, 0u) << "tensor data starts 8-byte aligned";
  EXPECT_NE(std::string(bytes.begin() + 8, bytes.begin() + 8 + header).find(R"("format":"pt")"),
            std::string::npos);
  auto back = parse_safetensors(bytes, "mixed");
  ASSERT_EQ(back.size(), mixed.size());
  for (size_t i = 0; i < mixed.size(); ++i) {
    EXPECT_EQ(back[i].first, mixed[i].first);
    EXPECT_EQ(back[i].second.scalar_type(), mixed[i].second.scalar_type()) << mixed[i].first;
    EXPECT_TRUE(torch::equal(back[i].second, mixed[i].second)) << mixed[i].first;
  }

  auto expect_error = [&](std::vector<char> damaged, const std::string& want) {
    try {
      parse_safetensors(damaged, "damaged.safetensors");
      ADD_FAILURE() << "accepted a damaged file (" << want << ")";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("damaged.safetensors"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  auto truncated = bytes;
  truncated.resize(bytes.size() - 3);
  expect_error(truncated, "truncated or corrupt");
  auto trailing = bytes;
  trailing.push_back(0);
  expect_error(trailing, "belong to none");
  expect_error({'P', 'K', 3, 4, 0, 0, 0, 0, 0}, "not a safetensors file");
  // Headers a fuzzer wrote: each refused before anything is allocated for the shape it gives.
  auto with_header = [](std::string json) {
    json += std::string((8 - json.size() % 8) % 8, ' ');
    std::vector<char> b(8, 0);
    for (int i = 0; i < 8; ++i)
      b[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    b.insert(b.end(), json.begin(), json.end());
    b.resize(b.size() + 16, 0);
    return b;
  };
  expect_error(with_header(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,16]}})"),
               "need more within a data section of 16 bytes");
  expect_error(
      with_header(
          R"({"t":{"dtype":"F32","shape":[1000000000,1000000000,1000000000],"data_offsets":[0,16]}})"),
      "need more within");
  expect_error(with_header(R"({"t":{"dtype":7,"shape":[4],"data_offsets":[0,16]}})"),
               "tensor t is malformed (type must be string, but is number)");
  expect_error(with_header(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,-16]}})"),
               "tensor t is malformed (a data offset must be a whole number from 0");
  expect_error(with_header(R"({"t":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})"),
               "tensor t is malformed (\"shape\" is not a list)");
  EXPECT_THROW(safetensors_bytes({{"c", torch::zeros({2}, torch::kComplexFloat)}}),
               CheckpointError);
}

TEST(StateDict, PythonSafetensorsReadsAndWritesIt) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/true);
  auto dir = dtorch::testing::scratch_dir("state-dict-safetensors-python");
  auto cnn = models::make_model("mnist-cnn");
  save_state_dict(*cnn, dir + "/cnn.safetensors", SaveFormat::Safetensors);
  std::string out;
  int rc = dtorch::testing::run_python(dir, "load", R"PY(
try:
    from safetensors.torch import load_file, save_file
except ImportError:
    print("SKIP no safetensors package for " + sys.executable + " (make test installs it)")
    sys.exit(0)
sd = load_file("cnn.safetensors")
net = peer.Net()
print(net.load_state_dict(sd, strict=True))
assert list(sd.keys()) == list(net.state_dict().keys())
mlp = peer.MLP()
save_file({k: v.contiguous() for k, v in mlp.state_dict().items()}, "mlp.safetensors")
print(json.dumps(mlp.state_dict()["fc3.bias"].tolist()))
)PY",
                                       {}, &out);
  ASSERT_EQ(rc, 0) << out;
  if (out.find("SKIP no safetensors") != std::string::npos) GTEST_SKIP() << out;
  auto fresh = models::make_model("mnist-mlp");
  load_state_dict(*fresh, dir + "/mlp.safetensors");
  auto expected = nlohmann::json::parse(out.substr(out.rfind('['))).get<std::vector<float>>();
  torch::Tensor bias = fresh->named_parameters()["fc3.bias"];
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(bias[i].item<float>(), expected[i]) << i;
}

}  // namespace
}  // namespace dtorch::checkpoint
