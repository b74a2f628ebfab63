#pragma once
// The vocabulary split over the tensor-parallel group (Megatron-LM's VocabParallelEmbedding and
// vocab_parallel_cross_entropy): rank r holds rows [begin, end) of the embedding table [V', C],
// where V' is the vocabulary padded to a multiple of tp, and computes the logits of those rows
// only. The full logits [N, V] never exist on one rank.
//
// Embedding: each rank looks up the tokens it owns (zeros for the others); the ranks' partial
// outputs are then summed by ReduceFromTp (or ReduceScatterToSequence under sequence parallelism).
//
// Cross-entropy of local logits [N, V'/tp]: the row maximum, the sum of exponentials and the target's
// logit (from the rank that owns it) summed over tp, in two all-reduces (N floats, then 2N: the
// sums and target logits travel together). The padding rows (global index
// >= V) are left out of every sum and get no gradient, so they never reach the loss, the gradients
// or the optimizer's result.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace zero::parallel {

// This rank's rows of the padded vocabulary.
struct VocabRange {
  int64_t vocab = 0;   // V, the real vocabulary
  int64_t padded = 0;  // V', a multiple of tp (and of `multiple`)
  int64_t begin = 0, end = 0;
  int64_t rows() const { return end - begin; }
  // Rows in [begin, end) that are real tokens (the rest is padding).
  int64_t real_rows() const;
};

// V rounded up to a multiple of tp x multiple (Megatron's make-vocab-size-divisible-by).
int64_t padded_vocab(int64_t vocab, int tp, int64_t multiple = 1);
// Throws InvalidArgument when vocab or tp is not positive, or tp_rank is out of range.
VocabRange vocab_range(int64_t vocab, int tp_rank, int tp, int64_t multiple = 1);

// out[n, :] = table[token[n] - begin, :] for the tokens this rank owns, 0 for the others
// (overwritten). `table` is this rank's [rows, dim]. Throws InvalidArgument naming the position of
// a token outside [0, vocab).
void vocab_embedding_forward(const VocabRange& range, const float* table, int64_t dim, const int* tokens,
                             size_t n, float* out);
// grad_table[token[n] - begin, :] += grad_out[n, :] for the tokens this rank owns.
void vocab_embedding_backward(const VocabRange& range, const int* tokens, size_t n, int64_t dim,
                              const float* grad_out, float* grad_table);

// The mean cross-entropy over n positions of local logits [n, rows] (this rank's columns), the same
// on every rank. Keeps the softmax of the local columns for backward.
class VocabParallelCrossEntropy {
 public:
  // Throws InvalidArgument naming the position of a target outside [0, vocab).
  float forward(comm::Communicator& tp, const VocabRange& range, const float* logits, const int* targets,
                size_t n);
  // grad_logits [n, rows] (overwritten) = (softmax - one_hot(target)) * scale / n; 0 on padding.
  void backward(float scale, float* grad_logits) const;

 private:
  VocabRange range_;
  std::vector<int> targets_;
  std::vector<float> probs_;  // [n, rows]
};

}  // namespace zero::parallel
