#include "zero/config/config_validation.h"

#include <fmt/format.h>

#include <initializer_list>
#include <optional>
#include <utility>

#include "base/check.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace zero::config_internal {
namespace {

template <typename Check>
void checked(const Context& ctx, const Origins& origins, const std::string& prefix, Check check) {
  try {
    check();
  } catch (const InvalidArgument& e) {
    std::string message = prefix + e.what();
    for (const auto& [field, key] : origins) {
      if (message.find(field) != std::string::npos) {
        message += fmt::format(" (set by {})", key);
        break;
      }
    }
    fail(ctx, message);
  }
}

}  // namespace

void validate_config(EngineConfig& c, const Context& ctx, const Origins& origins) {
  const EngineOptions& o = c.engine;
  Layout& l = c.layout;
  l.stage = o.stage;
  l.offload_optimizer = o.offload.optimizer;
  l.offload_params = o.offload.params;
  l.micro_batches = o.micro_batches;
  checked(ctx, origins, "", [&] { validate(o); });
  checked(ctx, origins, "optimizer.", [&] {
    optim::validate_groups(o.optimizer);
    if (o.optimizer.state_dtype != DType::kFloat32 && o.optimizer.state_dtype != DType::kBFloat16) {
      ZERO_THROW(InvalidArgument, "state_dtype must be fp32 or bf16, got {}", dtype_name(o.optimizer.state_dtype));
    }
    optim::validate_quantization(o.optimizer);
    if (o.optimizer.num_threads < 1 || o.optimizer.num_threads > 1024) {
      ZERO_THROW(InvalidArgument, "num_threads must be in [1, 1024], got {}", o.optimizer.num_threads);
    }
  });
  checked(ctx, origins, "dynamic_loss_scaler.", [&] { optim::DynamicLossScaler check(o.dynamic_loss_scaler); });
  checked(ctx, origins, "layout.", [&] {
    if (o.layout.alignment == 0) ZERO_THROW(InvalidArgument, "alignment must be > 0");
    if (o.layout.block == 0 || o.layout.block % o.layout.alignment != 0) {
      ZERO_THROW(InvalidArgument, "block ({}) must be a positive multiple of layout.alignment ({})", o.layout.block,
                 o.layout.alignment);
    }
    if (o.layout.bucket_numel == 0) ZERO_THROW(InvalidArgument, "bucket_numel must be > 0");
  });
  checked(ctx, origins, "", [&] {
    if (c.model_dtype && *c.model_dtype != DType::kFloat32 && !is_float16_family(*c.model_dtype)) {
      ZERO_THROW(InvalidArgument, "model_dtype must be fp32, fp16 or bf16, got {}", dtype_name(*c.model_dtype));
    }
    // The program's counts: each at least 1 when given.
    using Count = std::pair<const char*, std::optional<int>>;
    auto at_least_one = [](const char* section, std::initializer_list<Count> counts) {
      for (const auto& [name, value] : counts) {
        if (value && *value < 1) ZERO_THROW(InvalidArgument, "{}.{} must be >= 1, got {}", section, name, *value);
      }
    };
    at_least_one("loop", {{"micro_batch_size", c.loop.micro_batch_size},
                          {"global_batch_size", c.loop.global_batch_size},
                          {"log_every", c.loop.log_every}});
    if (c.loop.infer_micro_batches && !(c.loop.global_batch_size && c.loop.micro_batch_size)) {
      ZERO_THROW(InvalidArgument, "loop.infer_micro_batches needs loop.global_batch_size and loop.micro_batch_size "
                                  "(the micro-batches are the one divided by the other and the data-parallel ranks)");
    }
    // The layout's own rules (layout/layout.h), its engine fields the options' just copied.
    validate(l, "parallel");
  });
}

}  // namespace zero::config_internal
