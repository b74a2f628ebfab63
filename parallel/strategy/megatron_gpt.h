#pragma once
// Megatron-LM's GPT as its papers count it, described for the planner: what zero_plan --megatron
// L,C,H,V,T plans, to set the planner's choices beside published runs (docs/strategy.md's
// validation table: Narayanan et al. 2021's weak-scaling rows, BLOOM, GPT-NeoX).
//
// The tensors and FLOPs are the GPT's (gpt2.h: fused q|k|v, a 4x MLP, a head tied to the token
// embedding, Megatron's split with the vocabulary padded to a multiple of tp), so the FLOPs per
// token and layer are the paper's 24 h^2 + 4 s h forward and twice that backward. The activations
// are Korthikanti et al. 2022's (arXiv 2205.05198, Table 2) in 16 bits without flash attention: per
// token and layer 34 h + 5 a s bytes, of which 10 h (the LayerNorms' inputs, the regions' inputs and
// two dropout masks) are held whole under tp and split under sequence parallelism, and 24 h + 5 a s
// (q, k, v, the softmax, its dropout mask and output, the MLP's product and GELU) split by tp; the
// loss keeps its fp32 softmax over this rank's vocabulary. Full recompute keeps each layer's 2 h
// input, as Megatron's does.
#include "parallel/strategy/described_model.h"
#include "parallel/strategy/gpt2.h"

namespace zero::strategy {

ModelDescription describe_megatron_gpt(const Gpt2Shape& shape);

}  // namespace zero::strategy
