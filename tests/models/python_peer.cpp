// Python runner for the tests that compare with PyTorch (see python_peer.h). The peer is
// imported through importlib from its path, as it is a script, not an installed module.
#include "models/python_peer.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>

#include "dtorch/core/paths.h"
#include "dtorch/core/torch_compat.h"

namespace dtorch::testing {
namespace {

const std::string kPython = DTORCH_PYTHON;

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s)
    q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

int run_shell(const std::string& cmd, std::string* output) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    if (output) output->append(buf, n);
  int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

std::string peer_script() {
  return std::string(DTORCH_SOURCE_DIR) + "/bench/peer_ddp_mnist.py";
}

std::string python() {
  return kPython;
}

std::vector<std::string> torchrun_command() {
  if (compat::kTorch2) return {kPython, "-m", "torch.distributed.run"};
  return {kPython, std::string(DTORCH_SOURCE_DIR) + "/bench/torchrun_debian.py"};
}

std::string python_unavailable_reason(bool need_peer) {
  static const int torch_rc = [] {
    std::string out;
    // Whether the package is there, without importing it (a second of CPU or more, in every
    // test process that asks): the tests that use it import it, and fail if that breaks. From /
    // so that no 'torch' folder in the working directory shadows the package.
    return run_shell("cd / && " + quote(kPython) +
                         " -c 'import importlib.util, sys; "
                         "sys.exit(importlib.util.find_spec(\"torch\") is None)' 2>&1",
                     &out);
  }();
  if (torch_rc != 0) {
    return "no torch for " + kPython +
           (compat::kTorch2 ? " (make test TORCH=pip makes that environment)"
                            : " (apt-get install python3-torch)");
  }
  if (need_peer && !paths::is_regular_file(peer_script()))
    return "the peer " + peer_script() + " is missing from the checkout";
  return "";
}

int run_python(const std::string& dir, const std::string& name, const std::string& code,
               const std::vector<std::string>& args, std::string* output) {
  const std::string prelude = R"PY(import importlib.util, json, sys
import torch
peer = None
if sys.argv[1]:
    _spec = importlib.util.spec_from_file_location("torch_ddp_mnist", sys.argv[1])
    peer = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(peer)
)PY";
  const std::string path = dir + "/" + name + ".py";
  std::ofstream(path) << prelude << code << "\n";
  std::string cmd =
      "cd " + quote(dir) + " && " + quote(kPython) + " " + quote(path) + " " + quote(peer_script());
  for (const auto& a : args)
    cmd += " " + quote(a);
  return run_shell(cmd + " 2>&1", output);
}

nlohmann::json printed_result(const std::string& output) {
  const auto at = output.rfind("RESULT ");
  if (at == std::string::npos) return nlohmann::json::value_t::discarded;
  const auto end = output.find('\n', at);
  return nlohmann::json::parse(output.substr(at + 7, end == std::string::npos ? end : end - at - 7),
                               nullptr, false);
}

}  // namespace dtorch::testing
