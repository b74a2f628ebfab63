#include "optim/step_coeffs.h"

#include <charconv>
#include <cmath>
#include <system_error>

#include "optim/optimizer.h"

namespace zero::optim {

// 0.999f becomes 0.999, not 0.99900001287...: with the raw float, 1 - beta2 would be off by 1.3e-5
// relative from PyTorch's.
double decimal_double(float f) {
  if (!std::isfinite(f)) return f;
  char buf[64];
  const auto printed = std::to_chars(buf, buf + sizeof buf, f);
  if (printed.ec != std::errc()) return f;
  double d = f;
  const auto parsed = std::from_chars(buf, printed.ptr, d);
  if (parsed.ec != std::errc() || static_cast<float>(d) != f) return f;
  return d;
}

StepCoeffs compute_step_coeffs(OptimizerKind kind, const Hyper& h, int64_t step, float grad_scale,
                               bool sgd_first_momentum_step) {
  // Python floats are doubles: every expression below is evaluated in double, as in torch.optim, and
  // rounded to float once, where PyTorch's kernels convert the Python scalar to the tensor's type.
  const double lr = decimal_double(h.lr), wd = decimal_double(h.weight_decay);
  const double beta1 = decimal_double(h.beta1), beta2 = decimal_double(h.beta2);
  const double t = static_cast<double>(step);
  StepCoeffs c;
  c.grad_scale = grad_scale;
  c.weight_decay = h.weight_decay;
  c.eps = h.eps;
  c.neg_lr = static_cast<float>(-lr);
  if (wd != 0.0) c.flags |= kFlagWeightDecay;
  switch (kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdamW8bit:  // AdamW's arithmetic on dequantized moments (optim/adamw8bit.h)
    case OptimizerKind::kAdam: {
      if (kind != OptimizerKind::kAdam) c.decay = static_cast<float>(1.0 - lr * wd);
      c.beta1 = h.beta1;
      c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
      c.beta2 = h.beta2;
      c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
      const double bias_correction1 = 1.0 - std::pow(beta1, t);
      const double bias_correction2 = 1.0 - std::pow(beta2, t);
      c.neg_step_size = static_cast<float>(-(lr / bias_correction1));
      c.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
      break;
    }
    case OptimizerKind::kSgd:
      c.momentum = h.momentum;
      c.one_minus_dampening = static_cast<float>(1.0 - decimal_double(h.dampening));
      if (h.momentum != 0.0f) c.flags |= kFlagMomentum;
      if (h.nesterov) c.flags |= kFlagNesterov;
      if (sgd_first_momentum_step) c.flags |= kFlagFirstStep;
      break;
    case OptimizerKind::kAdagrad: {
      const double clr = lr / (1.0 + (t - 1.0) * decimal_double(h.lr_decay));
      c.neg_step_size = static_cast<float>(-clr);
      break;
    }
    case OptimizerKind::kLion:
      c.decay = static_cast<float>(1.0 - lr * wd);
      c.beta1 = h.beta1;
      c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
      c.beta2 = h.beta2;
      c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
      break;
    case OptimizerKind::kMuon:  // not elementwise: no kernel reads these (zero/grouped_shard_optimizer.cc)
    case OptimizerKind::kAdafactor:  // zero/adafactor_update.cc
      break;
  }
  return c;
}

}  // namespace zero::optim
