#pragma once
// The LibTorch example's model and data, written as a plain LibTorch program would: a residual MLP
// as a torch::nn::Sequential (an input projection, pre-LayerNorm blocks x + fc2(gelu(fc1(ln(x)))),
// a final LayerNorm and a linear head), and synthetic classification batches that are a pure
// function of (seed, step). scripts/libtorch_vs_pytorch.py builds the same model in PyTorch, in the
// same order, so both start from the same values.
#include <torch/torch.h>

#include <cstdint>

namespace zero::examples {

struct TorchMlpConfig {
  int64_t inputs = 32, hidden = 64, ff = 256, blocks = 3, classes = 10;
};

struct ResidualBlockImpl : torch::nn::Module {
  ResidualBlockImpl(int64_t hidden, int64_t ff)
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        fc1(register_module("fc1", torch::nn::Linear(hidden, ff))),
        fc2(register_module("fc2", torch::nn::Linear(ff, hidden))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::gelu(fc1(ln(x)))); }
  torch::nn::LayerNorm ln;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(ResidualBlock);

// Children "0" (input projection), "1".."blocks" (the blocks), then the final LayerNorm and the head:
// the adapter's default units.
inline torch::nn::Sequential make_torch_mlp(const TorchMlpConfig& c) {
  torch::nn::Sequential seq;
  seq->push_back(torch::nn::Linear(c.inputs, c.hidden));
  for (int64_t b = 0; b < c.blocks; ++b) seq->push_back(ResidualBlock(c.hidden, c.ff));
  seq->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
  seq->push_back(torch::nn::Linear(c.hidden, c.classes));
  return seq;
}

struct TorchBatch {
  torch::Tensor x, labels;
};

// Step `step`'s global batch: x ~ N(0, 1) from generator seed*1000 + step + 1, labels the argmax of
// x times a fixed teacher matrix (generator `seed`), so the task is learnable.
inline TorchBatch torch_mlp_batch(const TorchMlpConfig& c, int64_t batch, uint64_t seed, int step) {
  auto teacher_gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const torch::Tensor teacher = torch::randn({c.inputs, c.classes}, teacher_gen);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000 + static_cast<uint64_t>(step) + 1);
  torch::Tensor x = torch::randn({batch, c.inputs}, gen);
  return {x, x.matmul(teacher).argmax(1)};
}

}  // namespace zero::examples
