#pragma once
// The range checks of an Adam-like rule's hyperparameters (lr, weight_decay, beta1, beta2, eps), for
// the example rules written against the public interface (examples/adabelief.h, examples/lamb.h):
// CustomOptimizer::validate's contract, an InvalidArgument naming "groups[<index>].<field>".
#include <cmath>

#include "base/check.h"
#include "base/error.h"
#include "optim/optimizer.h"

namespace zero::examples {

inline void check_adam_like(const optim::Hyper& h, int group, const char* rule) {
  auto fail = [&](const char* field, float v, const char* range) {
    ZERO_THROW(InvalidArgument, "groups[{}].{} must be {} for {} (got {})", group, field, range, rule, v);
  };
  if (!(h.lr >= 0.0f) || !std::isfinite(h.lr)) fail("lr", h.lr, ">= 0");
  if (!(h.weight_decay >= 0.0f) || !std::isfinite(h.weight_decay)) fail("weight_decay", h.weight_decay, ">= 0");
  if (!(h.beta1 >= 0.0f && h.beta1 < 1.0f)) fail("beta1", h.beta1, "in [0, 1)");
  if (!(h.beta2 >= 0.0f && h.beta2 < 1.0f)) fail("beta2", h.beta2, "in [0, 1)");
  if (!(h.eps > 0.0f) || !std::isfinite(h.eps)) fail("eps", h.eps, "> 0");
}

}  // namespace zero::examples
