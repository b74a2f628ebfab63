#pragma once
// A nanoGPT-style model in LibTorch as a stack of layers for libtorch::TorchPipeline, tensor-parallel
// through adapters/libtorch/tensor_parallel.h (docs/libtorch.md):
//
//   layer 0          embedding: the vocabulary-parallel token embedding + the position embedding
//   layers 1 .. n    blocks: x + attn(ln1(x)), then x + mlp(ln2(x)); q, k and v column-parallel
//                    (this rank's heads), the attention's projection row-parallel; the MLP's fc
//                    column-parallel, its projection row-parallel
//   layer n + 1      head: ln_f, then this rank's vocabulary columns of the logits (the loss is
//                    vocabulary-parallel: gpt_loss), its weight tied to the token embedding's
//                    (gpt_tied: TorchStageFunctions.tied)
//
// At tp 1 every module is its unsplit self, so a run at any (dp, tp, pp) is comparable with the run on one rank: each layer is
// built from seed + its index (the tensor-parallel modules keep their slices of the unsplit draw).
#include <cmath>
#include <cstdint>

#include <torch/torch.h>

#include "adapters/libtorch/tensor_parallel.h"
#include "adapters/libtorch/torch_pipeline.h"
#include "base/check.h"
#include "base/error.h"
#include "comm/communicator.h"

namespace zero::examples {

struct TorchGptConfig {
  int64_t vocab = 64, block_size = 16, n_layer = 2, n_head = 4, n_embd = 32;
  int layers() const { return static_cast<int>(n_layer) + 2; }
};

struct GptEmbeddingImpl : torch::nn::Module {
  GptEmbeddingImpl(const TorchGptConfig& c, comm::Communicator& tp)
      : wte(register_module("wte", libtorch::VocabParallelEmbedding(c.vocab, c.n_embd, tp))),
        wpe(register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd))) {}
  // tokens [B, T] (int64) -> [B, T, C]
  torch::Tensor forward(torch::Tensor tokens) {
    return wte(tokens) + wpe(torch::arange(tokens.size(1), torch::kLong)).unsqueeze(0);
  }
  libtorch::VocabParallelEmbedding wte;
  torch::nn::Embedding wpe;
};
TORCH_MODULE(GptEmbedding);

struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(const TorchGptConfig& c, comm::Communicator& tp) : heads(c.n_head / tp.size()), head_dim(c.n_embd / c.n_head) {
    if (c.n_embd % c.n_head != 0) {
      ZERO_THROW(InvalidArgument, "GPT: n_embd = {} is not a multiple of n_head = {}", c.n_embd, c.n_head);
    }
    if (c.n_head % tp.size() != 0) {
      ZERO_THROW(InvalidArgument, "GPT: n_head = {} is not a multiple of tp = {}: each rank takes whole heads", c.n_head,
                 tp.size());
    }
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    q = register_module("q", libtorch::ColumnParallelLinear(c.n_embd, c.n_embd, tp));
    k = register_module("k", libtorch::ColumnParallelLinear(c.n_embd, c.n_embd, tp));
    v = register_module("v", libtorch::ColumnParallelLinear(c.n_embd, c.n_embd, tp));
    attn_proj = register_module("attn_proj", libtorch::RowParallelLinear(c.n_embd, c.n_embd, tp));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    fc = register_module("fc", libtorch::ColumnParallelLinear(c.n_embd, 4 * c.n_embd, tp));
    mlp_proj = register_module("mlp_proj", libtorch::RowParallelLinear(4 * c.n_embd, c.n_embd, tp));
  }
  torch::Tensor forward(torch::Tensor x) {
    const int64_t B = x.size(0), T = x.size(1);
    const torch::Tensor h = ln1(x);
    // [B, T, heads * head_dim] -> [B, heads, T, head_dim]
    auto split = [&](const torch::Tensor& t) { return t.view({B, T, heads, head_dim}).transpose(1, 2); };
    const torch::Tensor qh = split(q(h)), kh = split(k(h)), vh = split(v(h));
    torch::Tensor att = qh.matmul(kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    const torch::Tensor future = torch::ones({T, T}, torch::kBool).triu(1);
    att = torch::softmax(att.masked_fill(future, -INFINITY), -1);
    const torch::Tensor y = att.matmul(vh).transpose(1, 2).reshape({B, T, heads * head_dim});
    x = x + attn_proj(y);
    return x + mlp_proj(torch::gelu(fc(ln2(x))));
  }
  int64_t heads, head_dim;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  libtorch::ColumnParallelLinear q{nullptr}, k{nullptr}, v{nullptr}, fc{nullptr};
  libtorch::RowParallelLinear attn_proj{nullptr}, mlp_proj{nullptr};
};
TORCH_MODULE(GptBlock);

struct GptHeadImpl : torch::nn::Module {
  GptHeadImpl(const TorchGptConfig& c, comm::Communicator& tp)
      : ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})))),
        lm_head(register_module("lm_head", libtorch::ColumnParallelLinear(
                                               c.n_embd, c.vocab, tp, libtorch::ParallelLinearOptions{.bias = false}))) {}
  // [B, T, C] -> this rank's vocabulary columns of the logits [B, T, vocab / tp]
  torch::Tensor forward(torch::Tensor x) { return lm_head(ln_f(x)); }
  torch::nn::LayerNorm ln_f;
  libtorch::ColumnParallelLinear lm_head;
};
TORCH_MODULE(GptHead);

// Layer l of the stack, built from seed + l.
inline torch::nn::AnyModule gpt_layer(const TorchGptConfig& c, comm::Communicator& tp, int l, uint64_t seed) {
  torch::manual_seed(seed + static_cast<uint64_t>(l));
  if (l == 0) return torch::nn::AnyModule(GptEmbedding(c, tp));
  if (l == c.layers() - 1) return torch::nn::AnyModule(GptHead(c, tp));
  return torch::nn::AnyModule(GptBlock(c, tp));
}

// The head's weight is the token embedding's: both [vocab / tp, n_embd], split alike.
inline std::vector<libtorch::TiedWeight> gpt_tied(const TorchGptConfig& c) {
  return {{.first = "0.wte.weight", .last = std::to_string(c.layers() - 1) + ".lm_head.weight"}};
}

// The mean cross-entropy of the head's local logits [B, T, vocab / tp] against targets [B, T].
inline torch::Tensor gpt_loss(const TorchGptConfig& c, comm::Communicator& tp, const torch::Tensor& logits,
                              const torch::Tensor& targets) {
  const parallel::VocabRange range = parallel::vocab_range(c.vocab, tp.rank(), tp.size());
  if (range.padded != c.vocab) ZERO_THROW(InvalidArgument, "GPT: vocab = {} is not a multiple of tp = {}", c.vocab, tp.size());
  return libtorch::vocab_parallel_cross_entropy(logits.reshape({-1, range.rows()}), targets.reshape({-1}), range, tp);
}

}  // namespace zero::examples
