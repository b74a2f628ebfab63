#pragma once
// Reading the PyTorch reference files of the GPT (tests/data/pytorch/gpt format) and running their
// "check" entry: one forward and backward at the initial parameters. Shared by the model's unit test
// and the reference worker that also runs the "train" entry through the engine.
#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "examples/gpt/gpt_model.h"

namespace zero::examples {

// A file's [B][T + 1] token rows as the model's inputs and next-token targets, B x T each.
struct TokenBatch {
  std::vector<int> inputs, targets;
  int B = 0, T = 0;
};

inline TokenBatch split_rows(const nlohmann::json& rows_json) {
  const auto rows = rows_json.get<std::vector<std::vector<int>>>();
  TokenBatch b;
  b.B = static_cast<int>(rows.size());
  b.T = rows.empty() ? 0 : static_cast<int>(rows[0].size()) - 1;
  for (const auto& row : rows) {
    b.inputs.insert(b.inputs.end(), row.begin(), row.end() - 1);
    b.targets.insert(b.targets.end(), row.begin() + 1, row.end());
  }
  return b;
}

inline GptConfig reference_config(const nlohmann::json& ref) {
  const auto& c = ref["config"];
  return {c["vocab_size"], c["block_size"], c["n_embd"], c["n_head"], c["n_layer"]};
}

// The file's model: its config and its initial parameters.
inline Gpt reference_model(const nlohmann::json& ref) {
  Gpt model(reference_config(ref), 1);
  for (auto& p : model.params()) p.values = ref["initial_params"][p.name].get<std::vector<float>>();
  return model;
}

struct CheckResult {
  double loss = 0, want_loss = 0;
  struct Grad {
    std::string name;
    double worst = 0;    // max |ours - PyTorch| over the tensor
    double largest = 0;  // max |PyTorch| over the tensor
  };
  std::vector<Grad> grads;
};

// "check": forward and backward of `model` (at the file's initial parameters) on the check batch,
// gradients into plain buffers; `enter` sees every unit the model enters.
inline CheckResult run_check(const nlohmann::json& ref, Gpt& model,
                             const std::function<void(int, bool)>& enter = [](int, bool) {}) {
  const TokenBatch batch = split_rows(ref["check"]["tokens"]);
  std::vector<std::vector<float>> grads;
  for (const auto& p : model.params()) grads.emplace_back(p.values.size(), 0.0f);
  Gpt::Access access;
  access.grad = [&](size_t i) { return grads[i].data(); };
  access.enter = [&](int unit, Gpt::Pass pass) { enter(unit, pass != Gpt::Pass::kForward); };
  CheckResult r;
  r.loss = model.forward(batch.inputs, batch.targets, batch.B, batch.T, access);
  r.want_loss = ref["check"]["loss"].get<double>();
  model.backward(1.0f, access);
  for (size_t i = 0; i < grads.size(); ++i) {
    CheckResult::Grad g{model.params()[i].name};
    const auto want = ref["check"]["grads"][g.name].get<std::vector<float>>();
    if (want.size() != grads[i].size()) {
      g.worst = INFINITY;  // a gradient of another shape cannot match
    } else {
      for (size_t e = 0; e < want.size(); ++e) {
        g.largest = std::max(g.largest, std::fabs(static_cast<double>(want[e])));
        g.worst = std::max(g.worst, std::fabs(static_cast<double>(want[e]) - grads[i][e]));
      }
    }
    r.grads.push_back(g);
  }
  return r;
}

}  // namespace zero::examples
