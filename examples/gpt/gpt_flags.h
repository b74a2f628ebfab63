#pragma once
// The GPT's shape from the programs' flags (--n-layer, --n-embd, --n-head, --block-size), each
// defaulting to `defaults`; the vocabulary is the byte-level one (256) the examples train on.
#include <string>

#include "tools/cli/flags.h"
#include "examples/gpt/gpt_model.h"
#include "parallel/strategy/gpt2.h"

namespace zero::examples {

inline GptConfig gpt_config_from_flags(cli::Flags& flags, const GptConfig& defaults) {
  GptConfig c = defaults;
  c.vocab_size = 256;
  c.n_layer = flags.get_int("n-layer", defaults.n_layer);
  c.n_embd = flags.get_int("n-embd", defaults.n_embd);
  c.n_head = flags.get_int("n-head", defaults.n_head);
  c.block_size = flags.get_int("block-size", defaults.block_size);
  return c;
}

// The GPT's five numbers as the planner reads them (parallel/strategy/gpt2.h), and back.
inline GptConfig gpt_config_of(const strategy::Gpt2Shape& s) {
  return {.vocab_size = s.vocab_size, .block_size = s.block_size, .n_embd = s.n_embd, .n_head = s.n_head,
          .n_layer = s.n_layer};
}
inline strategy::Gpt2Shape gpt2_shape(const GptConfig& c) {
  return {.vocab_size = c.vocab_size, .block_size = c.block_size, .n_embd = c.n_embd, .n_head = c.n_head,
          .n_layer = c.n_layer};
}
// "n_layer,n_embd,n_head[,vocab_size,block_size]" (the programs' --gpt).
inline GptConfig gpt_config_of_shape(const std::string& text) { return gpt_config_of(strategy::parse_gpt2_shape(text)); }

}  // namespace zero::examples
