// Test helper: runs snippets on Debian's /usr/bin/python3 with the Python peer
// (shared/peers/torch_ddp_mnist.py) importable, so C++ results are checked against PyTorch.
#pragma once

#include <string>
#include <vector>

namespace dtorch::testing {

/// Path of the peer script, or "" when it is not beside the repository.
std::string peer_script();

/// Why Python checks cannot run here ("" when they can): no /usr/bin/python3, no
/// python3-torch, or (when `need_peer`) no peer script.
std::string python_unavailable_reason(bool need_peer);

/// Writes `code` to DIR/NAME.py and runs it with /usr/bin/python3 from `dir` (which holds
/// no 'torch' folder, so `import torch` finds the installed one), with argv[1] the peer
/// script path and then `args`. Before `code` runs, `peer` is the imported peer module when
/// the script exists (else None). Returns the exit code; stdout+stderr go to *output.
int run_python(const std::string& dir, const std::string& name, const std::string& code,
               const std::vector<std::string>& args, std::string* output);

}  // namespace dtorch::testing

/// Skips the current test when Python (and, if need_peer, the peer script) is unavailable.
#define DTORCH_SKIP_WITHOUT_PYTHON(need_peer)                                   \
  do {                                                                          \
    std::string why_ = ::dtorch::testing::python_unavailable_reason(need_peer); \
    if (!why_.empty()) GTEST_SKIP() << why_;                                    \
  } while (0)
