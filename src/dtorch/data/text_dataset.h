// Byte-level text for language models: any text file (or folder of them) as int64 token ids
// 0..255, cut into fixed-length windows a DistributedSampler can shuffle like samples.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtorch::data {

/// Where Debian's fortunes package installs its text files: the default corpus (about
/// 2.6 MB of English prose, verse and jokes).
inline constexpr const char* kDefaultTextDir = "/usr/share/games/fortunes";

/// A text as a stream of byte tokens.
struct TextData {
  /// int64, 1-D: each byte of the text as an id 0..255 (the vocabulary of gpt-debug).
  torch::Tensor tokens;
  /// What was read (a file or folder path), for messages.
  std::string source;

  int64_t size() const { return tokens.defined() ? tokens.numel() : 0; }
};

/// Reads `spec`: "" is the default corpus kDefaultTextDir; otherwise a text file, or a folder
/// whose regular files (not hidden, not fortune's *.dat / *.u8 index files) are
/// concatenated in name order. Throws DataError naming the path and the fix when it is
/// missing or holds no bytes (for the default: apt-get install fortunes).
TextData load_text(const std::string& spec);

/// Train and validation parts of a text.
struct TextSplits {
  TextData train;
  TextData val;
};
/// The last `val_fraction` of the tokens (rounded down) is validation, the rest training,
/// so the two never share a window. Throws ConfigError unless 0 <= val_fraction < 1.
TextSplits split_text(const TextData& text, double val_fraction = 0.1);

/// Note [Text windows]: window i is tokens [i T, i T + T] (T + 1 tokens, T = seq_len): its
/// first T are the inputs and its last T the targets. Consecutive windows overlap by the one
/// token that is the last target of one and the first input of the next, so every token
/// but the first is a target exactly once per epoch. Windows are the "samples" of a text:
/// give num_windows() to DistributedSampler and its indices to text_batch().
///
/// How many windows of `seq_len` fit: (size - 1) / seq_len. Throws DataError naming the
/// source when not even one fits (text shorter than seq_len + 1 tokens), and ConfigError
/// when seq_len < 1.
int64_t num_windows(const TextData& text, int64_t seq_len);

/// A batch of windows: row b is window windows[b].
struct TextBatch {
  torch::Tensor inputs;   ///< int64, B x T
  torch::Tensor targets;  ///< int64, B x T: inputs shifted left by one token
};

/// The windows at `windows` (any order, repeats allowed; see Note [Text windows]) as one
/// batch. Throws DataError for a window index outside 0..num_windows-1.
TextBatch text_batch(const TextData& text, const std::vector<int64_t>& windows, int64_t seq_len);

}  // namespace dtorch::data
