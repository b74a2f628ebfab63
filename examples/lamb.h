#pragma once
// LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes", ICLR
// 2020, Algorithm 2, with bias correction and phi the identity) as a user brings a rule that needs
// whole tensors: written against the public interface alone (optim/custom_optimizer.h; docs/optim.md,
// "Your own optimizer"). It needs EngineOptions.layout.whole_tensors, which gives each tensor to one
// rank whole; without it the engine refuses the rule, naming it. The training examples take it as
// --optimizer lamb (and set the layout).
//
// Per tensor, step t (from 1), gradient g, parameter x, with a group's lr, weight_decay, beta1, beta2
// and eps:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//   u = r + weight_decay x
//   trust = ||x|| / ||u||, or 1 where either norm is 0
//   x = x - lr trust u
// The norms are summed in double. Checked against scripts/lamb_reference.py (PyTorch) by
// examples/lamb_test.cc.
#include <cmath>
#include <string>
#include <vector>

#include "examples/adam_like_checks.h"
#include "optim/custom_optimizer.h"

namespace zero::examples {

class Lamb final : public optim::CustomOptimizer {
 public:
  std::string name() const override { return "lamb"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  bool needs_whole_tensors() const override { return true; }

  void validate(const optim::Hyper& h, int g) const override { check_adam_like(h, g, "lamb"); }

  // `r` is a whole tensor (the engine's promise with whole_tensors).
  void update(const optim::UpdateContext& context, const optim::OwnedRange& r) override {
    const optim::Hyper& h = context.groups[static_cast<size_t>(r.group)];
    const double t = static_cast<double>(context.step);
    const float bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), t));
    const float bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta2), t));
    const float one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
    const float one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
    float* m = r.state[0];
    float* v = r.state[1];
    update_.resize(r.numel);  // grows to the largest tensor once
    double x_norm2 = 0.0, u_norm2 = 0.0;
    for (size_t i = 0; i < r.numel; ++i) {
      const float g = r.grad[i];
      m[i] = h.beta1 * m[i] + one_minus_beta1 * g;
      v[i] = h.beta2 * v[i] + one_minus_beta2 * (g * g);
      const float ratio = (m[i] / bias_correction1) / (std::sqrt(v[i] / bias_correction2) + h.eps);
      const float x = r.master[i];
      update_[i] = ratio + h.weight_decay * x;
      x_norm2 += static_cast<double>(x) * x;
      u_norm2 += static_cast<double>(update_[i]) * update_[i];
    }
    const double trust = x_norm2 > 0.0 && u_norm2 > 0.0 ? std::sqrt(x_norm2) / std::sqrt(u_norm2) : 1.0;
    const float step = static_cast<float>(static_cast<double>(h.lr) * trust);
    for (size_t i = 0; i < r.numel; ++i) r.master[i] -= step * update_[i];
  }

 private:
  std::vector<float> update_;  // u of the tensor being updated (update() runs on one thread at a time)
};

}  // namespace zero::examples
