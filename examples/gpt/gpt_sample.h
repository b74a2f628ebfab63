#pragma once
// Text from the trained GPT: top-k sampling over its next-token logits, and bytes made printable.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zero::examples {

// `prompt` followed by `tokens` more, each drawn from the `top_k` most likely of next_logits(text so
// far) by their softmax weights (top_k 0: the most likely, greedy), from a generator seeded `seed`:
// every rank that calls it alike draws the same text.
std::vector<int> sample_text(std::vector<int> prompt, int tokens, int top_k, uint64_t seed,
                             const std::function<std::vector<float>(const std::vector<int>&)>& next_logits);

// Bytes as text: newlines and printable ASCII kept, anything else '?'.
std::string printable(const std::vector<int>& tokens);

}  // namespace zero::examples
