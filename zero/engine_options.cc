#include "zero/engine_options.h"

#include <fmt/format.h>

#include "base/check.h"
#include "optim/custom_optimizer.h"

namespace zero {

const char* micro_batch_policy_name(MicroBatchReduce r) {
  switch (r) {
    case MicroBatchReduce::kDefault: return "default";
    case MicroBatchReduce::kEach: return "each";
    case MicroBatchReduce::kOnce: return "once";
  }
  return "?";
}

const char* micro_batch_policy_name(MicroBatchGather g) {
  switch (g) {
    case MicroBatchGather::kDefault: return "default";
    case MicroBatchGather::kEach: return "each";
    case MicroBatchGather::kOnce: return "once";
  }
  return "?";
}

namespace {

template <typename Policy>
Policy parse_policy(const std::string& name, const char* what) {
  for (Policy p : {Policy::kDefault, Policy::kEach, Policy::kOnce}) {
    if (name == micro_batch_policy_name(p)) return p;
  }
  ZERO_THROW(InvalidArgument, "unknown {} '{}' (expected default, each or once)", what, name);
}

}  // namespace

MicroBatchReduce parse_micro_batch_reduce(const std::string& name) {
  return parse_policy<MicroBatchReduce>(name, "micro_batch_reduce");
}

MicroBatchGather parse_micro_batch_gather(const std::string& name) {
  return parse_policy<MicroBatchGather>(name, "micro_batch_gather");
}

int parse_quantized_bits(const std::string& name, const char* what) {
  if (name == "int8") return 8;
  if (name == "int4") return 4;
  if (name == "off") return 0;
  ZERO_THROW(InvalidArgument, "{} takes int8, int4 or off, got '{}'", what, name);
}

void validate(const EngineOptions& o) {
  if (o.stage < 0 || o.stage > 3) {
    ZERO_THROW(InvalidArgument, "EngineOptions.stage must be 0, 1, 2 or 3, got {}", o.stage);
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
  if (o.param_dtype) {
    check_float_dtype(*o.param_dtype, "param_dtype");
    if (o.stage != 3) {
      ZERO_THROW(InvalidArgument,
                 "EngineOptions.param_dtype {} needs stage 3 (got stage {}): below it the parameters are your registered "
                 "storage, so register them in the dtype to compute in (the engine keeps the fp32 master)",
                 dtype_name(*o.param_dtype), o.stage);
    }
  }
  if (o.micro_batches < 1) {
    ZERO_THROW(InvalidArgument, "EngineOptions.micro_batches must be >= 1, got {}", o.micro_batches);
  }

  if (o.loss_scaling == LossScaling::kStatic && !(o.static_loss_scale > 0.0f)) {
    ZERO_THROW(InvalidArgument, "EngineOptions.static_loss_scale must be > 0, got {}",
               o.static_loss_scale);
  }
  if (o.max_inflight_buckets < 1) {
    ZERO_THROW(InvalidArgument, "EngineOptions.max_inflight_buckets must be >= 1, got {}",
               o.max_inflight_buckets);
  }
  if (o.offload.params && (o.stage != 3 || !o.offload.optimizer)) {
    ZERO_THROW(InvalidArgument,
               "EngineOptions.offload.params needs stage 3 (got stage {}) and offload.optimizer (got {}): only stage 3 "
               "shards the parameters, and the offloaded optimizer is what writes the new values on the host",
               o.stage, o.offload.optimizer);
  }
  if (o.timeout.count() <= 0) {
    ZERO_THROW(InvalidArgument, "EngineOptions.timeout must be positive");
  }
  const EngineOptions::QuantizedGathers& qw = o.quantized_weights;
  if (qw.bits != 0 && qw.bits != 8 && qw.bits != 4) {
    ZERO_THROW(InvalidArgument, "EngineOptions.quantized_weights.bits must be 0 (off), 8 or 4, got {}", qw.bits);
  }
  if (qw.bits != 0 && qw.block == 0) {
    ZERO_THROW(InvalidArgument, "EngineOptions.quantized_weights.block must be positive");
  }
  if (qw.bits != 0 && o.stage != 3) {
    ZERO_THROW(InvalidArgument,
               "EngineOptions.quantized_weights (qwZ) needs stage 3 (got stage {}): only stage 3 gathers the "
               "parameters before each use",
               o.stage);
  }
  const EngineOptions::QuantizedReduction& qg = o.quantized_gradients;
  if (qg.bits != 0 && qg.bits != 8 && qg.bits != 4) {
    ZERO_THROW(InvalidArgument, "EngineOptions.quantized_gradients.bits must be 0 (off), 8 or 4, got {}", qg.bits);
  }
  if (qg.bits != 0 && qg.block == 0) {
    ZERO_THROW(InvalidArgument, "EngineOptions.quantized_gradients.block must be positive");
  }
  if (qg.stochastic && qg.bits == 0) {
    ZERO_THROW(InvalidArgument, "EngineOptions.quantized_gradients.stochastic rounds qgZ's codes, but "
               "quantized_gradients.bits is 0 (off)");
  }
  if (o.node_size < 0) ZERO_THROW(InvalidArgument, "EngineOptions.node_size must be >= 0, got {}", o.node_size);
  if (o.replica_check_every < 0) {
    ZERO_THROW(InvalidArgument, "EngineOptions.replica_check_every must be >= 0 (0: never), got {}", o.replica_check_every);
  }
  for (const auto& [on, name] : {std::pair{o.secondary_shard, "secondary_shard (hpZ)"},
                                 std::pair{qg.bits != 0, "quantized_gradients (qgZ)"}}) {
    if (!on) continue;
    if (o.stage != 3) {
      ZERO_THROW(InvalidArgument, "EngineOptions.{} needs stage 3 (got stage {}): it reshapes stage 3's gathers and "
                 "reductions", name, o.stage);
    }
  }
  if (o.optimizer.custom && o.optimizer.custom->needs_whole_tensors() && !o.layout.whole_tensors) {
    ZERO_THROW(InvalidArgument,
               "EngineOptions.optimizer.custom: '{}' needs whole tensors (a per-tensor rule), but the flat ranges cut "
               "tensors across ranks and buckets: set EngineOptions.layout.whole_tensors (each tensor owned by one "
               "rank; docs/optim.md)",
               o.optimizer.custom->name());
  }
}

const char* loss_scaling_name(LossScaling s) {
  switch (s) {
    case LossScaling::kNone: return "none";
    case LossScaling::kStatic: return "static";
    case LossScaling::kDynamic: return "dynamic";
  }
  return "unknown";
}

std::vector<std::pair<std::string, std::string>> fingerprint(const EngineOptions& o) {
  std::vector<std::pair<std::string, std::string>> f;
  auto add = [&f](const std::string& field, const auto& value) {
    f.emplace_back("EngineOptions." + field, fmt::format("{}", value));
  };
  add("stage", o.stage);
  add("optimizer.kind", optim::optimizer_label(o.optimizer));
  add("optimizer.state_dtype", dtype_name(o.optimizer.state_dtype));
  add("optimizer.quant_block", o.optimizer.quant_block);
  add("optimizer.quant_min_numel", o.optimizer.quant_min_numel);
  add("optimizer.groups.size", o.optimizer.groups.size());
  for (size_t i = 0; i < o.optimizer.groups.size(); ++i) {
    const optim::Hyper& h = o.optimizer.groups[i];
    const std::string g = fmt::format("optimizer.groups[{}].", i);
    add(g + "lr", h.lr);
    add(g + "weight_decay", h.weight_decay);
    add(g + "beta1", h.beta1);
    add(g + "beta2", h.beta2);
    add(g + "eps", h.eps);
    add(g + "momentum", h.momentum);
    add(g + "dampening", h.dampening);
    add(g + "nesterov", h.nesterov);
    add(g + "lr_decay", h.lr_decay);
    add(g + "initial_accumulator_value", h.initial_accumulator_value);
    add(g + "kind", h.kind ? optim::optimizer_name(*h.kind) : "unset");
    add(g + "params", fmt::format("[{}]", fmt::join(h.params, ", ")));
    add(g + "muon", fmt::format("{} {} {} {} {} {}", h.muon.momentum, h.muon.nesterov, h.muon.ns_steps, h.muon.rms_scale,
                                h.muon.per_part, h.muon.bf16));
    add(g + "adafactor", fmt::format("{} {} {} {} {} {}", h.adafactor.eps1, h.adafactor.eps2, h.adafactor.clip_threshold,
                                     h.adafactor.decay_rate, h.adafactor.relative_step, h.adafactor.beta1));
  }
  add("max_grad_norm", o.max_grad_norm);
  add("param_dtype", o.param_dtype ? dtype_name(*o.param_dtype) : "registered");
  add("reduce_dtype", dtype_name(o.reduce_dtype));
  add("grad_accum_dtype", dtype_name(o.grad_accum_dtype));
  add("micro_batches", o.micro_batches);
  add("micro_batch_reduce", micro_batch_policy_name(o.micro_batch_reduce));
  add("micro_batch_gather", micro_batch_policy_name(o.micro_batch_gather));
  add("deterministic", o.deterministic);
  add("loss_scaling", loss_scaling_name(o.loss_scaling));
  add("static_loss_scale", o.static_loss_scale);
  const optim::LossScalerOptions& d = o.dynamic_loss_scaler;
  add("dynamic_loss_scaler.initial_scale", d.initial_scale);
  add("dynamic_loss_scaler.growth_factor", d.growth_factor);
  add("dynamic_loss_scaler.backoff_factor", d.backoff_factor);
  add("dynamic_loss_scaler.growth_interval", d.growth_interval);
  add("dynamic_loss_scaler.hysteresis", d.hysteresis);
  add("dynamic_loss_scaler.min_scale", d.min_scale);
  add("dynamic_loss_scaler.consecutive_hysteresis", d.consecutive_hysteresis);
  add("layout.alignment", o.layout.alignment);
  add("layout.bucket_numel", o.layout.bucket_numel);
  add("layout.block", o.layout.block);
  add("layout.whole_tensors", o.layout.whole_tensors);
  add("reshard_after_forward", o.reshard_after_forward);
  add("prefetch_bytes", o.prefetch_bytes);
  add("max_live_gathered_bytes", o.max_live_gathered_bytes);
  add("param_persistence_bytes", o.param_persistence_bytes);
  add("quantized_weights.bits", o.quantized_weights.bits);
  add("quantized_weights.block", o.quantized_weights.block);
  add("quantized_weights.backward", o.quantized_weights.backward);
  add("quantized_weights.evaluation", o.quantized_weights.evaluation);
  add("node_size", o.node_size);
  add("secondary_shard", o.secondary_shard);
  add("quantized_gradients.bits", o.quantized_gradients.bits);
  add("quantized_gradients.block", o.quantized_gradients.block);
  add("quantized_gradients.stochastic", o.quantized_gradients.stochastic);
  add("offload.optimizer", o.offload.optimizer);
  add("offload.params", o.offload.params);
  add("replica_check_every", o.replica_check_every);
  return f;
}

EngineOptions engine_options(const Layout& layout, EngineOptions base) {
  base.stage = layout.stage;
  base.offload.optimizer = layout.offload_optimizer;
  base.offload.params = layout.offload_params;
  base.micro_batches = layout.micro_batches;
  return base;
}

void check_layout(const EngineOptions& o, const Layout& l) {
  auto differ = [&](const char* option, auto value, const char* field, auto want) {
    ZERO_THROW(InvalidArgument,
               "EngineOptions.{} is {} but the mesh's layout has {}={} (build the options with "
               "engine_options(layout, base), or the mesh from the layout the run uses)",
               option, value, field, want);
  };
  if (o.stage != l.stage) differ("stage", o.stage, "stage", l.stage);
  if (o.offload.optimizer != l.offload_optimizer) {
    differ("offload.optimizer", o.offload.optimizer, "offload_optimizer", l.offload_optimizer);
  }
  if (o.offload.params != l.offload_params) differ("offload.params", o.offload.params, "offload_params", l.offload_params);
}

}  // namespace zero
