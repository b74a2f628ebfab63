#pragma once
// A LLaMA-family model (LLaMA, Mistral, Qwen2, Gemma: RMSNorm, a gated MLP, rotary positions,
// grouped-query attention where num_key_value_heads < num_attention_heads) described for the planner from its HuggingFace
// config.json, the file every such checkpoint ships beside its weights. The config gives the shapes;
// the rest is how such a model is trained, the assumptions examples/models/llama2_7b.json states:
// Megatron's tensor-parallel split (q, k, v and the MLP's gate and up projections column-parallel,
// the attention output and the down projection row-parallel, the vocabulary split and padded), bf16
// activations, flash attention (a block keeps the log-sum-exp, not the probabilities), and a block
// keeping its two norms' inputs, its two regions' gathered inputs, q, k, v, the attention output and
// the MLP's three products; the head keeps fp32 logits. FLOPs: 2 per matrix element and token a pass,
// attention's 4 T (heads x head_dim) forward and twice that backward.
//
// Read: model_type ("llama", "mistral", "qwen2" or "gemma"), hidden_size, intermediate_size,
// num_attention_heads, num_hidden_layers, vocab_size; num_key_value_heads (default: the attention
// heads), head_dim (default: hidden_size / heads), tie_word_embeddings (default false; Gemma's true),
// max_position_embeddings (the sequence length when none is given), attention_bias (biases on q, k,
// v and the output projection; Qwen2 has them on q, k and v always) and mlp_bias (on the MLP's three).
// A bias is a tensor without weight decay, split as its projection's outputs; its FLOPs and
// activations are negligible beside the products' and are not counted. The config's other keys
// (dtypes, rope, token ids, a sliding window) do not change the plan and are not read.
#include <string>
#include <string_view>

#include "parallel/strategy/described_model.h"

namespace zero::strategy {

// `sequence_length` 0: the config's max_position_embeddings. InvalidArgument naming `source` and the
// field for a missing or mistyped one, another model_type, or a shape that does not divide.
ModelDescription describe_llama(std::string_view config_json, const std::string& source, int sequence_length = 0);
ModelDescription load_llama_description(const std::string& path, int sequence_length = 0);  // IoError

}  // namespace zero::strategy
