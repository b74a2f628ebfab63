#pragma once
// Byte-level text data for the GPT example: every byte is a token (vocabulary 256). The default
// corpus is the licence texts every Debian machine has (/usr/share/common-licenses, from
// base-files), read file by file in name order, symbolic links skipped (they repeat other files);
// any file or directory can be given instead. The last `val_fraction` of the bytes is held out.
//
// Batches: sequence j of step s starts at a position drawn from (seed, s, j) alone, so every rank
// computes the same global batch and takes its own slice of it, and a resumed run sees the data the
// uninterrupted run would have.
#include <cstdint>
#include <string>
#include <vector>

namespace zero::examples {

class TextData {
 public:
  // Throws IoError naming the path when nothing can be read, InvalidArgument when the text is too
  // short for one sequence of `block` + 1 bytes in each split.
  TextData(const std::string& path, int block, double val_fraction, uint64_t seed);

  // Sequences [first, first + count) of global batch `step` of the training split (validation: the
  // held-out split), as inputs and next-byte targets, count x block each.
  void batch(int64_t step, int first, int count, bool validation, std::vector<int>* inputs,
             std::vector<int>* targets) const;

  size_t train_bytes() const { return train_.size(); }
  // The entropy of the training text's byte frequencies (nats per byte): the loss of the best model
  // that ignores context, the line a language model must get well below.
  double unigram_entropy() const;
  size_t val_bytes() const { return val_.size(); }
  const std::string& source() const { return source_; }
  // `n` bytes of the training text as tokens, from the first occurrence of `marker` (the start when
  // it does not occur): a prompt for sampling.
  std::vector<int> prompt(const std::string& marker, size_t n) const;

 private:
  std::string source_;
  std::vector<uint8_t> train_, val_;
  int block_;
  uint64_t seed_;
};

std::string default_corpus();  // "/usr/share/common-licenses"

}  // namespace zero::examples
