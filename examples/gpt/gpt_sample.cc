#include "examples/gpt/gpt_sample.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace zero::examples {

std::vector<int> sample_text(std::vector<int> text, int tokens, int top_k, uint64_t seed,
                             const std::function<std::vector<float>(const std::vector<int>&)>& next_logits) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < tokens; ++i) {
    const std::vector<float> logits = next_logits(text);
    int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (top_k > 0) {
      std::vector<int> order(logits.size());
      for (size_t v = 0; v < order.size(); ++v) order[v] = static_cast<int>(v);
      std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                        [&](int a, int b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
      std::vector<double> w;
      for (int k = 0; k < top_k; ++k) w.push_back(std::exp(logits[static_cast<size_t>(order[static_cast<size_t>(k)])]));
      next = order[std::discrete_distribution<size_t>(w.begin(), w.end())(rng)];
    }
    text.push_back(next);
  }
  return text;
}

std::string printable(const std::vector<int>& tokens) {
  std::string s;
  for (int t : tokens) s += (t == '\n' || (t >= 32 && t < 127)) ? static_cast<char>(t) : '?';
  return s;
}

}  // namespace zero::examples
