#include "zero/engine_options.h"

#include "base/check.h"

namespace zero {

void validate(const EngineOptions& o) {
  if (o.stage < 0 || o.stage > 2) {
    ZERO_THROW(InvalidArgument, "EngineOptions.stage must be 0, 1 or 2, got {}", o.stage);
  }
  if (!(o.max_grad_norm >= 0.0f)) {
    ZERO_THROW(InvalidArgument, "EngineOptions.max_grad_norm must be >= 0, got {}", o.max_grad_norm);
  }
  auto check_float_dtype = [](DType t, const char* field) {
    if (t != DType::kFloat32 && t != DType::kFloat16 && t != DType::kBFloat16) {
      ZERO_THROW(InvalidArgument, "EngineOptions.{} must be fp32, fp16 or bf16, got {}", field,
                 dtype_name(t));
    }
  };
  check_float_dtype(o.reduce_dtype, "reduce_dtype");
  check_float_dtype(o.grad_accum_dtype, "grad_accum_dtype");
  if (o.gradient_accumulation_steps < 1) {
    ZERO_THROW(InvalidArgument, "EngineOptions.gradient_accumulation_steps must be >= 1, got {}",
               o.gradient_accumulation_steps);
  }
  if (!o.reduce_every_micro_step && o.stage >= 2) {
    ZERO_THROW(InvalidArgument,
               "EngineOptions.reduce_every_micro_step=false (no_sync) needs full local gradients, "
               "which stage {} does not keep; use stage 0 or 1",
               o.stage);
  }
  if (o.loss_scaling == LossScaling::kStatic && !(o.static_loss_scale > 0.0f)) {
    ZERO_THROW(InvalidArgument, "EngineOptions.static_loss_scale must be > 0, got {}",
               o.static_loss_scale);
  }
  if (o.max_inflight_buckets < 1) {
    ZERO_THROW(InvalidArgument, "EngineOptions.max_inflight_buckets must be >= 1, got {}",
               o.max_inflight_buckets);
  }
  if (o.timeout.count() <= 0) {
    ZERO_THROW(InvalidArgument, "EngineOptions.timeout must be positive");
  }
}

}  // namespace zero
