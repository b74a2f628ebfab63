#pragma once
// A GPT-2-shaped model (learned positions, pre-LayerNorm blocks of fused q|k|v attention and a 4x GELU
// MLP, a head tied to the token embedding) described for the planner from its five numbers, as
// hf_llama.h does for the LLaMA family: what zero_plan --gpt L,C,H[,V,T] plans. The description is
// how examples/gpt trains it (fp32 activations, attention probabilities kept, Megatron's split with
// the vocabulary padded to a multiple of tp, a vocabulary-parallel loss), so a plan's activation
// bytes are the ones that model allocates; examples/gpt/gpt_description_test.cc holds the two
// equal on every layout of 1, 2 and 4 ranks.
#include <string>

#include "parallel/strategy/described_model.h"
#include "zero/engine_options.h"

namespace zero::strategy {

struct Gpt2Shape {
  int vocab_size = 256;
  int block_size = 64;  // the context, T
  int n_embd = 64;
  int n_head = 4;
  int n_layer = 2;
};

// "n_layer,n_embd,n_head[,vocab_size,block_size]" (vocabulary 256 and context 64 when left out);
// InvalidArgument naming `flag` and the text otherwise, or when n_head does not divide n_embd.
Gpt2Shape parse_gpt2_shape(const std::string& text, const std::string& flag = "--gpt");
std::string gpt2_shape_text(const Gpt2Shape& shape);  // "L,C,H,V,T"

// `fp32_norms`: the LayerNorms and biases in fp32 beside a bf16 model's matrices (as train_gpt
// --fp32-norms keeps them). Its "kernels" prefix is "gpt/L,C,H,V,T", what calibrate_gpt times.
ModelDescription describe_gpt2(const Gpt2Shape& shape, bool fp32_norms = false);

// The optimizer recipe a GPT-2 run uses (train_gpt's, and the planner's when no config is given):
// AdamW with betas (0.9, 0.95), weight decay 0.1 on the matrices and embeddings (group 0) and none on
// the norms and biases (group 1), gradients clipped to norm 1.
EngineOptions gpt2_engine_options(float lr);

}  // namespace zero::strategy
