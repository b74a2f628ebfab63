#pragma once
// The GPT's shape from the programs' flags (--n-layer, --n-embd, --n-head, --block-size), each
// defaulting to `defaults`; the vocabulary is the byte-level one (256) the examples train on.
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "base/check.h"
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

// "n_layer,n_embd,n_head[,vocab_size,block_size]" (the planners' --gpt); InvalidArgument naming the
// text otherwise.
inline GptConfig gpt_config_of_shape(const std::string& text) {
  std::vector<int> v;
  std::stringstream parts(text);
  for (std::string p; std::getline(parts, p, ',');) {
    char* end = nullptr;
    const long x = std::strtol(p.c_str(), &end, 10);
    if (p.empty() || *end != '\0' || x < 1 || x > 1 << 24) {
      ZERO_THROW(InvalidArgument, "--gpt '{}': '{}' is not a positive integer", text, p);
    }
    v.push_back(static_cast<int>(x));
  }
  if (v.size() != 3 && v.size() != 5) {
    ZERO_THROW(InvalidArgument, "--gpt '{}': expected n_layer,n_embd,n_head[,vocab_size,block_size]", text);
  }
  GptConfig c;
  c.n_layer = v[0];
  c.n_embd = v[1];
  c.n_head = v[2];
  if (v.size() == 5) {
    c.vocab_size = v[3];
    c.block_size = v[4];
  }
  if (c.n_embd % c.n_head != 0) {
    ZERO_THROW(InvalidArgument, "--gpt '{}': n_head {} does not divide n_embd {}", text, c.n_head, c.n_embd);
  }
  return c;
}

}  // namespace zero::examples
