#include "parallel/strategy/megatron_gpt.h"

#include <fmt/format.h>

namespace zero::strategy {

ModelDescription describe_megatron_gpt(const Gpt2Shape& s) {
  using Split = ActivationTerm::Split;
  using When = ActivationTerm::When;
  ModelDescription m = describe_gpt2(s);
  const double h = s.n_embd, a = s.n_head, T = s.block_size, V = s.vocab_size;
  m.name = fmt::format("Megatron GPT {} layers, hidden {}, {} heads, vocabulary {}, sequence {}", s.n_layer, s.n_embd,
                       s.n_head, s.vocab_size, s.block_size);
  m.kernels.clear();  // FLOPs at the cluster's rate: no calibrated kernels of this model
  m.activation_dtype = DType::kFloat16;
  auto token = [](double bytes, Split split = Split::kNone, When when = When::kAny) {
    return ActivationTerm{ActivationTerm::Per::kToken, bytes, split, when};
  };
  auto per_micro_batch = [](double bytes) { return ActivationTerm{ActivationTerm::Per::kMicroBatch, bytes}; };

  // The embedding's dropout mask (a byte per element); a split backward's weight part keeps the
  // stream's gradient for the position table and, under tp, the whole for the token table.
  m.embedding.activations = {token(h, Split::kSequence)};
  m.embedding.weight_work = {token(2 * h, Split::kSequence), token(2 * h, Split::kNone, When::kAboveTp1)};

  // A block: 10 h held whole (split under sp), 24 h + 5 a s split by tp.
  m.block.activations = {token(10 * h, Split::kSequence), token(24 * h + 5 * a * T, Split::kTp)};
  // The weight part reads the four linear layers' inputs: q|k|v's and fc1's (the LayerNorms'
  // outputs, 2 h each, as held), the projection's and fc2's (2 h and 8 h, split); the input part adds
  // their output gradients (6 h and 8 h split, 2 h twice as held) and six fp32 column sums.
  m.block.weight_reads = std::vector<ActivationTerm>{token(4 * h, Split::kSequence), token(10 * h, Split::kTp)};
  m.block.weight_work = {per_micro_batch(6 * 4 * h), token(4 * h, Split::kSequence), token(14 * h, Split::kTp)};

  // The head: the final LayerNorm's input and output, and the cross entropy's fp32 softmax over
  // this rank's rows of the vocabulary; the weight part reads the LayerNorm's output and keeps the
  // logits' gradient.
  m.head.activations = {token(2 * h, Split::kSequence), token(2 * h), token(4 * V, Split::kVocab)};
  m.head.weight_reads = std::vector<ActivationTerm>{token(2 * h)};
  m.head.weight_work = {token(2 * V, Split::kVocab), per_micro_batch(2 * 4 * h)};
  return m;
}

}  // namespace zero::strategy
