// Test helper: runs snippets on the Python whose torch matches the LibTorch under test (Debian's
// /usr/bin/python3 for 1.13, the virtual environment's for PyPI's 2.x; DTORCH_PYTHON at
// configure time) with the Python peer (bench/peer_ddp_mnist.py) importable, so C++
// results are checked against PyTorch.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace dtorch::testing {

/// Path of the peer script, bench/peer_ddp_mnist.py in the repository.
std::string peer_script();

/// The Python interpreter the tests compare with (its torch matches the LibTorch under test).
std::string python();

/// PyTorch's torchrun for that Python, as the start of a command line: Debian's 1.13 needs
/// the patched bench/torchrun_debian.py (its own crashes on Python 3.11), 2.x has
/// `python -m torch.distributed.run`.
std::vector<std::string> torchrun_command();

/// Why Python checks cannot run here ("" when they can): no such Python, no torch for it, or
/// (when `need_peer`) no peer script.
std::string python_unavailable_reason(bool need_peer);

/// Writes `code` to DIR/NAME.py and runs it with python() from `dir` (which holds
/// no 'torch' folder, so `import torch` finds the installed one), with argv[1] the peer
/// script path and then `args`. Before `code` runs, `peer` is the imported peer module when
/// the script exists (else None). Returns the exit code; stdout+stderr go to *output.
int run_python(const std::string& dir, const std::string& name, const std::string& code,
               const std::vector<std::string>& args, std::string* output);

/// What a snippet printed as its result: the JSON after "RESULT " on the last line that has
/// it; a discarded json (is_discarded()) when there is none or it does not parse.
nlohmann::json printed_result(const std::string& output);

}  // namespace dtorch::testing

/// Skips the current test when Python (and, if need_peer, the peer script) is unavailable.
#define DTORCH_SKIP_WITHOUT_PYTHON(need_peer)                                   \
  do {                                                                          \
    std::string why_ = ::dtorch::testing::python_unavailable_reason(need_peer); \
    if (!why_.empty()) GTEST_SKIP() << why_;                                    \
  } while (0)
