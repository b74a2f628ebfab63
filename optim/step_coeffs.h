#pragma once
// The scalars of one optimizer step for one parameter group, computed once on the host.
//
// PyTorch computes these in Python (double precision) and the tensor kernels then round each one to
// float where it meets a float tensor; compute_step_coeffs does the same, so every kernel (scalar,
// AVX2, AVX-512, CUDA) uses identical float values and reproduces PyTorch's arithmetic. The struct is
// plain data so CUDA kernels can take it by value (this header is included by nvcc).
#include <cstdint>

namespace zero::optim {

enum class OptimizerKind;
struct Hyper;

struct StepCoeffs {
  float grad_scale = 1.0f;         // g = grad * grad_scale, first of all
  float weight_decay = 0.0f;       // L2 form (Adam, SGD, Adagrad): g += weight_decay * p
  float decay = 1.0f;              // decoupled form (AdamW, Lion): p *= decay, decay = 1 - lr*wd
  float beta1 = 0.0f, one_minus_beta1 = 1.0f;
  float beta2 = 0.0f, one_minus_beta2 = 1.0f;
  float bias_correction2_sqrt = 1.0f;  // Adam/AdamW: sqrt(1 - beta2^t)
  float eps = 0.0f;
  float neg_step_size = 0.0f;  // Adam/AdamW: -lr / (1 - beta1^t); Adagrad: -lr / (1 + (t-1)*lr_decay)
  float neg_lr = 0.0f;         // SGD, Lion: -lr
  float momentum = 0.0f;       // SGD
  float one_minus_dampening = 1.0f;  // SGD
  uint32_t flags = 0;                // kFlag* below
};

inline constexpr uint32_t kFlagWeightDecay = 1u;  // L2 weight decay is applied (weight_decay != 0)
inline constexpr uint32_t kFlagMomentum = 2u;     // SGD: momentum != 0 (the buffer is used)
inline constexpr uint32_t kFlagNesterov = 4u;     // SGD
inline constexpr uint32_t kFlagFirstStep = 8u;    // SGD: the momentum buffer starts as a copy of d_p

// The double a user means by a float hyperparameter: the shortest decimal that round-trips to the
// float, read as a double (0.999f is 0.999, as Python's float(0.999)).
double decimal_double(float f);

// `step` is the 1-based index of the step being taken. `sgd_first_momentum_step` is true when the
// group's momentum buffer does not exist yet (PyTorch then sets buf = d_p without dampening).
StepCoeffs compute_step_coeffs(OptimizerKind kind, const Hyper& h, int64_t step, float grad_scale,
                               bool sgd_first_momentum_step);

}  // namespace zero::optim
