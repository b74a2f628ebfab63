#pragma once
// The GPT's shape from the programs' flags (--n-layer, --n-embd, --n-head, --block-size), each
// defaulting to `defaults`; the vocabulary is the byte-level one (256) the examples train on.
#include "examples/flags.h"
#include "examples/gpt/gpt_model.h"

namespace zero::examples {

inline GptConfig gpt_config_from_flags(Flags& flags, const GptConfig& defaults) {
  GptConfig c = defaults;
  c.vocab_size = 256;
  c.n_layer = flags.get_int("n-layer", defaults.n_layer);
  c.n_embd = flags.get_int("n-embd", defaults.n_embd);
  c.n_head = flags.get_int("n-head", defaults.n_head);
  c.block_size = flags.get_int("block-size", defaults.block_size);
  return c;
}

}  // namespace zero::examples
