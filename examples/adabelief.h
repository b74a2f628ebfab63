#pragma once
// AdaBelief (Zhuang et al., NeurIPS 2020) as a user brings an update rule the library does not ship:
// written against the public interface alone (optim/custom_optimizer.h; docs/optim.md, "Your own
// optimizer"). The training examples take it as --optimizer adabelief.
//
// The authors' adabelief-pytorch 0.2.0 step with decoupled weight decay and no rectification
// (weight_decouple=True, rectify=False), operation for operation:
//   p *= 1 - lr * wd
//   m = b1 m + (1 - b1) g
//   s = b2 s + (1 - b2) (g - m)^2;  s += eps                   (in place: the state keeps the eps)
//   p -= lr / (1 - b1^t) * m / (sqrt(s) / sqrt(1 - b2^t) + eps)
// It uses a group's lr, weight_decay, beta1, beta2 and eps. Each element's update reads only that
// element: the interface's elementwise contract, so any stage and world size gives the same bits.
#include <cmath>
#include <string>
#include <vector>

#include "examples/adam_like_checks.h"
#include "optim/custom_optimizer.h"

namespace zero::examples {

class AdaBelief final : public optim::CustomOptimizer {
 public:
  std::string name() const override { return "adabelief"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_var"}; }

  void validate(const optim::Hyper& h, int g) const override { check_adam_like(h, g, "adabelief"); }

  void update(const optim::UpdateContext& context, const optim::OwnedRange& r) override {
    const optim::Hyper& h = context.groups[static_cast<size_t>(r.group)];
    const double t = static_cast<double>(context.step);
    const float bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), t));
    const float sqrt_bias_correction2 = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), t)));
    const float step_size = h.lr / bias_correction1;
    const float decay = 1.0f - h.lr * h.weight_decay;
    float* m = r.state[0];
    float* s = r.state[1];
    for (size_t i = 0; i < r.numel; ++i) {
      const float g = r.grad[i];
      float p = r.master[i];
      if (h.weight_decay != 0.0f) p *= decay;
      m[i] = m[i] * h.beta1 + g * (1.0f - h.beta1);
      const float residual = g - m[i];
      s[i] = s[i] * h.beta2 + residual * residual * (1.0f - h.beta2);
      s[i] += h.eps;
      const float denom = std::sqrt(s[i]) / sqrt_bias_correction2 + h.eps;
      r.master[i] = p - step_size * (m[i] / denom);
    }
  }
};

}  // namespace zero::examples
