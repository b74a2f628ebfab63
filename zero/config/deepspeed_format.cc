#include "zero/config/deepspeed_format.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "zero/config/config_validation.h"

namespace zero::config_internal {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

class DeepSpeedReader {
 public:
  DeepSpeedReader(EngineConfig& c, const Context& ctx) : c_(c), ctx_(ctx) {}

  void read(const json& root) {
    ObjectReader top(root, "", ctx_);
    // DeepSpeed's default: without zero_optimization.stage it runs plain data parallelism.
    c_.engine.stage = 0;
    read_precision(top);  // first: the model dtype converts the stage-3 element counts to bytes
    read_batch(top);
    read_optimizer(top);
    with(top, "zero_optimization", [&](ObjectReader& z) { read_zero(z); });
    read_communication(top);
    read_misc(top);
    top.finish();
    validate_config(c_, ctx_, origins_);
  }

 private:
  enum class Kind { kBool, kCount, kAny };

  template <typename F>
  void with(ObjectReader& parent, const char* key, F&& body) {
    const json* j = parent.find(key);
    if (j == nullptr) return;
    ObjectReader child(*j, parent.path(key), ctx_);
    body(child);
    child.finish();
  }
  void set_by(std::string field, const std::string& key) { origins_.emplace_back(std::move(field), key); }

  // A key whose only supported value is `expected`: what the engine always does.
  void require(ObjectReader& r, const char* key, bool expected, std::string_view why) {
    const json* j = r.find(key);
    if (j == nullptr || read_bool(*j, r.path(key), ctx_) == expected) return;
    fail(ctx_, fmt::format("{} = {} is not supported: {}", r.path(key), !expected, why));
  }
  void require_number(ObjectReader& r, const char* key, double expected, std::string_view why) {
    const json* j = r.find(key);
    if (j == nullptr || read_number(*j, r.path(key), ctx_) == expected) return;
    fail(ctx_, fmt::format("{} = {} is not supported (only {}): {}", r.path(key), j->dump(), expected, why));
  }
  void refuse(ObjectReader& r, const char* key, std::string_view why) {
    if (r.find(key) != nullptr) fail(ctx_, fmt::format("{} is not supported: {}", r.path(key), why));
  }
  // Accepted, type-checked, and listed in the notes with the reason it changes nothing here (refused
  // when reading strictly).
  void note(ObjectReader& r, const char* key, Kind kind, std::string_view why) {
    const json* j = r.find(key);
    if (j == nullptr) return;
    const std::string path = r.path(key);
    if (kind == Kind::kBool) read_bool(*j, path, ctx_);
    if (kind == Kind::kCount) read_integer(*j, path, ctx_, 0, INT64_MAX);
    if (ctx_.strict) fail(ctx_, fmt::format("{} has no effect here (strict reading): {}", path, why));
    c_.notes.push_back(fmt::format("{}: no effect: {}", path, why));
  }

  std::optional<int64_t> integer(ObjectReader& r, const char* key, int64_t lo, int64_t hi) {
    const json* j = r.find(key);
    if (j == nullptr) return std::nullopt;
    return read_integer(*j, r.path(key), ctx_, lo, hi);
  }
  std::optional<bool> boolean(ObjectReader& r, const char* key) {
    const json* j = r.find(key);
    if (j == nullptr) return std::nullopt;
    return read_bool(*j, r.path(key), ctx_);
  }
  std::optional<float> number(ObjectReader& r, const char* key) {
    const json* j = r.find(key);
    if (j == nullptr) return std::nullopt;
    return read_float(*j, r.path(key), ctx_);
  }
  std::optional<DType> dtype(ObjectReader& r, const char* key) {
    const json* j = r.find(key);
    if (j == nullptr) return std::nullopt;
    const std::string name = read_string(*j, r.path(key), ctx_, "fp32, fp16 or bf16");
    for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      if (name == dtype_name(t)) return t;
    }
    fail(ctx_, fmt::format("{} must be fp32, fp16 or bf16, got \"{}\"", r.path(key), name));
  }

  // ---- batch and loop ----

  void read_batch(ObjectReader& top) {
    const auto global = integer(top, "train_batch_size", 1, INT_MAX);
    const auto micro = integer(top, "train_micro_batch_size_per_gpu", 1, INT_MAX);
    const auto steps = integer(top, "gradient_accumulation_steps", 1, INT_MAX);
    if (const auto every = integer(top, "steps_per_print", 1, INT_MAX)) c_.loop.log_every = static_cast<int>(*every);
    if (global) c_.loop.global_batch_size = static_cast<int>(*global);
    if (micro) c_.loop.micro_batch_size = static_cast<int>(*micro);
    if (steps) c_.engine.micro_batches = static_cast<int>(*steps);
    if (global && micro && !steps) {
      // DeepSpeed infers the accumulation steps from the world size, which a file is read without:
      // the program resolves them at launch (resolve_micro_batches).
      if (*global % *micro != 0) {
        fail(ctx_, fmt::format("train_batch_size ({}) is not a multiple of train_micro_batch_size_per_gpu ({})",
                               *global, *micro));
      }
      c_.loop.infer_micro_batches = true;
      c_.notes.push_back(fmt::format(
          "gradient_accumulation_steps: not given; train_batch_size / (train_micro_batch_size_per_gpu x "
          "data-parallel ranks) = {} / ({} x ranks) at launch, as DeepSpeed infers it",
          *global, *micro));
    }
    if (global && micro && steps && *global % (*micro * *steps) != 0) {
      fail(ctx_, fmt::format("train_batch_size ({}) is not a multiple of train_micro_batch_size_per_gpu ({}) x "
                             "gradient_accumulation_steps ({})",
                             *global, *micro, *steps));
    }
    if (const auto clip = number(top, "gradient_clipping")) {
      c_.engine.max_grad_norm = *clip;
      set_by("EngineOptions.max_grad_norm", "gradient_clipping");
    }
  }

  // ---- fp16 / bf16 ----

  void read_precision(ObjectReader& top) {
    bool fp16 = false, bf16 = false;
    with(top, "fp16", [&](ObjectReader& r) { fp16 = read_fp16(r); });
    with(top, "bf16", [&](ObjectReader& r) { bf16 = read_bf16(r); });
    if (fp16 && bf16) fail(ctx_, "fp16.enabled and bf16.enabled are both true: choose one model dtype");
  }

  bool read_fp16(ObjectReader& r) {
    const bool enabled = boolean(r, "enabled").value_or(false);
    require(r, "auto_cast", false, "the engine does not cast the model's inputs; the training loop does");
    require(r, "fp16_master_weights_and_grads", false, "the engine keeps fp32 master weights");
    const auto loss_scale = number(r, "loss_scale");
    const auto power = integer(r, "initial_scale_power", 0, 127);
    const auto window = integer(r, "loss_scale_window", 1, INT_MAX);
    const auto hysteresis = integer(r, "hysteresis", 1, INT_MAX);
    const auto consecutive = boolean(r, "consecutive_hysteresis");
    const auto min_scale = number(r, "min_loss_scale");
    if (loss_scale && *loss_scale < 0) fail(ctx_, fmt::format("fp16.loss_scale must be >= 0, got {}", *loss_scale));
    const std::vector<std::pair<const char*, bool>> dynamic_keys{{"initial_scale_power", power.has_value()},
                                                                 {"loss_scale_window", window.has_value()},
                                                                 {"hysteresis", hysteresis.has_value()},
                                                                 {"consecutive_hysteresis", consecutive.has_value()},
                                                                 {"min_loss_scale", min_scale.has_value()}};
    if (!enabled) {
      if (loss_scale) c_.notes.push_back("fp16.loss_scale: no effect: fp16.enabled is false");
      for (const auto& [key, given] : dynamic_keys) {
        if (given) c_.notes.push_back(fmt::format("fp16.{}: no effect: fp16.enabled is false", key));
      }
      return false;
    }
    c_.model_dtype = DType::kFloat16;
    if (loss_scale && *loss_scale > 0) {
      c_.engine.loss_scaling = LossScaling::kStatic;
      c_.engine.static_loss_scale = *loss_scale;
      for (const auto& [key, given] : dynamic_keys) {
        if (given) c_.notes.push_back(fmt::format("fp16.{}: no effect: fp16.loss_scale > 0 is a static scale", key));
      }
      return true;
    }
    c_.engine.loss_scaling = LossScaling::kDynamic;
    optim::LossScalerOptions& d = c_.engine.dynamic_loss_scaler;
    d.growth_interval = 1000;  // DeepSpeed's loss_scale_window default (ours is 2000)
    // DeepSpeed's scale_factor is fixed at 2 (growth and backoff alike): our defaults.
    if (power) d.initial_scale = std::ldexp(1.0f, static_cast<int>(*power));
    if (window) d.growth_interval = static_cast<int>(*window);
    if (hysteresis) d.hysteresis = static_cast<int>(*hysteresis);
    if (consecutive) d.consecutive_hysteresis = *consecutive;
    if (min_scale) d.min_scale = *min_scale;
    if (power) set_by("dynamic_loss_scaler.initial_scale", "fp16.initial_scale_power");
    if (min_scale) set_by("dynamic_loss_scaler.min_scale", "fp16.min_loss_scale");
    return true;
  }

  bool read_bf16(ObjectReader& r) {
    const bool enabled = boolean(r, "enabled").value_or(false);
    require(r, "bf16_master_weights_and_grads", false,
            "the engine keeps fp32 master weights (and the gradient shard in grad_accum_dtype)");
    require(r, "bf16_optimizer_states", false,
            "DeepSpeed ties it to bf16 master weights; our format's optimizer.state_dtype = \"bf16\" keeps the "
            "optimizer state in bf16 over fp32 master weights");
    if (enabled) c_.model_dtype = DType::kBFloat16;
    return enabled;
  }

  // ---- optimizer ----

  // optimizer.params takes the names of the torch optimizer's constructor: a key the type does not
  // take is an error, as it is in torch.
  static const std::set<std::string>& params_of(const std::string& type) {
    static const std::set<std::string> adam{"lr",      "betas",           "eps",        "weight_decay",
                                            "amsgrad", "bias_correction", "torch_adam", "adam_w_mode"};
    static const std::set<std::string> sgd{"lr", "momentum", "dampening", "weight_decay", "nesterov"};
    static const std::set<std::string> adagrad{"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"};
    static const std::set<std::string> lion{"lr", "betas", "weight_decay"};
    if (type == "sgd") return sgd;
    if (type == "adagrad") return adagrad;
    if (type == "lion") return lion;
    return adam;
  }

  void read_optimizer(ObjectReader& top) {
    with(top, "optimizer", [&](ObjectReader& r) {
      const json* type = r.find("type");
      if (type == nullptr) fail(ctx_, "optimizer.type is required (Adam, AdamW, SGD, Adagrad or Lion)");
      std::string name = read_string(*type, r.path("type"), ctx_, "an optimizer name");
      // DeepSpeed's CPU Adam under its names in older configs (DeepSpeedExamples' Megatron-LM offload
      // scripts say "DeepSpeed_Adam"): Adam with adam_w_mode, on the offload tier's CPU optimizer here.
      if (const std::string l = lower(name); l == "deepspeed_adam" || l == "deepspeedcpuadam" || l == "cpuadam") {
        c_.notes.push_back(fmt::format("optimizer.type \"{}\": DeepSpeed's CPU Adam, read as Adam (adam_w_mode as "
                                       "given, default true); with offload the CPU optimizer runs it",
                                       name));
        name = "Adam";
      }
      const std::string t = lower(name);
      if (t != "adam" && t != "adamw" && t != "sgd" && t != "adagrad" && t != "lion") {
        fail(ctx_, fmt::format("optimizer.type \"{}\" is not supported (expected Adam, AdamW, SGD, Adagrad, Lion, or "
                               "DeepSpeed_Adam for DeepSpeed's CPU Adam)",
                               name));
      }
      std::optional<bool> w_mode = boolean(r, "adam_w_mode");
      optim::Hyper h;
      with(r, "params", [&](ObjectReader& p) {
        const std::set<std::string>& takes = params_of(t);
        for (const std::set<std::string>* all : {&params_of("adam"), &params_of("sgd"), &params_of("adagrad")}) {
          for (const std::string& key : *all) {
            if (!takes.count(key) && p.find(key) != nullptr) {
              fail(ctx_,
                   fmt::format("{} does not apply to {} (it takes {})", p.path(key), name, fmt::join(takes, ", ")));
            }
          }
        }
        const auto inner = boolean(p, "adam_w_mode");
        if (inner && w_mode && *inner != *w_mode) {
          fail(ctx_, "optimizer.adam_w_mode and optimizer.params.adam_w_mode disagree");
        }
        if (inner) w_mode = inner;
        read_params(p, h);
      });
      c_.engine.optimizer.kind = optimizer_kind(name, w_mode);
      c_.engine.optimizer.groups = {h};
    });
  }

  optim::OptimizerKind optimizer_kind(const std::string& name, std::optional<bool> w_mode) {
    const std::string t = lower(name);
    if (w_mode && t != "adam" && t != "adamw") {
      fail(ctx_, fmt::format("optimizer.adam_w_mode does not apply to {}", name));
    }
    // DeepSpeed's Adam defaults to adam_w_mode = true: decoupled weight decay, which is AdamW.
    if (t == "adam") return w_mode.value_or(true) ? optim::OptimizerKind::kAdamW : optim::OptimizerKind::kAdam;
    if (t == "adamw") {
      if (w_mode == false) fail(ctx_, "optimizer: AdamW with adam_w_mode = false is a contradiction (use type Adam)");
      return optim::OptimizerKind::kAdamW;
    }
    if (t == "sgd") return optim::OptimizerKind::kSgd;
    return t == "adagrad" ? optim::OptimizerKind::kAdagrad : optim::OptimizerKind::kLion;
  }

  void read_params(ObjectReader& p, optim::Hyper& h) {
    // The keys have our names (those of optim::Hyper), except betas.
    auto take = [&](const char* key, float& field) {
      if (const auto v = number(p, key)) {
        field = *v;
        set_by(fmt::format("groups[0].{}", key), p.path(key));
      }
    };
    take("lr", h.lr);
    take("weight_decay", h.weight_decay);
    take("eps", h.eps);
    take("momentum", h.momentum);
    take("dampening", h.dampening);
    take("lr_decay", h.lr_decay);
    take("initial_accumulator_value", h.initial_accumulator_value);
    if (const auto v = boolean(p, "nesterov")) {
      h.nesterov = *v;
      set_by("groups[0].nesterov", p.path("nesterov"));
    }
    if (const json* betas = p.find("betas")) {
      const std::string path = p.path("betas");
      if (!betas->is_array() || betas->size() != 2) fail_type(*betas, path, ctx_, "an array of two numbers");
      h.beta1 = read_float((*betas)[0], path + "[0]", ctx_);
      h.beta2 = read_float((*betas)[1], path + "[1]", ctx_);
      set_by("groups[0].beta1", path + "[0]");
      set_by("groups[0].beta2", path + "[1]");
    }
    require(p, "bias_correction", true, "the Adam family always corrects the moments' bias (PyTorch's semantics)");
    require(p, "amsgrad", false, "AMSGrad is not implemented");
    note(p, "torch_adam", Kind::kBool, "it picks DeepSpeed's implementation; ours has PyTorch's semantics either way");
  }

  // ---- zero_optimization ----

  void read_zero(ObjectReader& z) {
    if (const auto stage = integer(z, "stage", 0, 3)) c_.engine.stage = static_cast<int>(*stage);
    require(z, "overlap_comm", true,
            "the engine always overlaps the gradient reduction with backward (up to max_inflight_buckets)");
    require(z, "contiguous_gradients", true, "the engine always copies gradients into contiguous flat buckets");
    require(z, "reduce_scatter", true,
            "the engine always reduce-scatters gradients when the optimizer is sharded (stages 1 to 3)");
    require(z, "allgather_partitions", true, "the engine always all-gathers updated parameters");
    read_cpu_offload(z);
    if (const auto qw = boolean(z, "zero_quantized_weights"); qw && *qw) {
      // ZeRO++'s qwZ: its int8 blocks, both passes' gathers.
      c_.engine.quantized_weights = {.bits = 8, .block = 256, .backward = true};
      set_by("quantized_weights", z.path("zero_quantized_weights"));
    }
    if (const auto qg = boolean(z, "zero_quantized_gradients"); qg && *qg) {
      // ZeRO++'s qgZ: int4 blocks in both hops, as DeepSpeed's all_to_all_quant_reduce.
      c_.engine.quantized_gradients = {.bits = 4, .block = 256};
      set_by("quantized_gradients", z.path("zero_quantized_gradients"));
    }
    if (const auto hpz = integer(z, "zero_hpz_partition_size", 1, INT_MAX); hpz && *hpz != 1) {
      // ZeRO++'s hpZ: the secondary shard within groups of that many ranks (a node's).
      c_.engine.node_size = static_cast<int>(*hpz);
      c_.engine.secondary_shard = true;
      set_by("secondary_shard", z.path("zero_hpz_partition_size"));
    }
    read_mics(z);
    read_buckets(z);
    with(z, "offload_optimizer", [&](ObjectReader& r) {
      if (cpu_offload_ && r.find("device") != nullptr) {
        fail(ctx_, fmt::format("{} and {} both say where the optimizer lives: keep offload_optimizer (cpu_offload is "
                               "DeepSpeed's deprecated form)",
                               z.path("cpu_offload"), r.path("device")));
      }
      read_offload(r, false);
    });
    with(z, "offload_param", [&](ObjectReader& r) { read_offload(r, true); });
    read_stage3(z);
    note(z, "stage3_max_reuse_distance", Kind::kCount,
         "units are kept gathered by reshard_after_forward, param_persistence_bytes and the gather window instead");
    note(z, "sub_group_size", Kind::kCount, "the optimizer always steps bucket by bucket");
    note(z, "stage3_gather_16bit_weights_on_model_save", Kind::kBool,
         "Engine::export_safetensors always gathers the full weights");
    note(z, "stage3_gather_fp16_weights_on_model_save", Kind::kBool,
         "Engine::export_safetensors always gathers the full weights");
    note(z, "round_robin_gradients", Kind::kBool, "offloaded gradient shards are copied bucket by bucket");
    note(z, "load_from_fp32_weights", Kind::kBool, "checkpoints always hold and load the fp32 master weights");
    note(z, "elastic_checkpoint", Kind::kBool, "checkpoints load at any world size and stage");
  }

  // DeepSpeed's deprecated cpu_offload (older configs, DeepSpeedExamples' Megatron-LM offload scripts):
  // the optimizer offloaded to host memory, as offload_optimizer.device = cpu says now.
  void read_cpu_offload(ObjectReader& z) {
    const auto on = boolean(z, "cpu_offload");
    if (!on) return;
    cpu_offload_ = true;
    if (ctx_.strict && *on) {
      fail(ctx_, fmt::format("{} is DeepSpeed's deprecated form (strict reading): use "
                             "zero_optimization.offload_optimizer.device = cpu",
                             z.path("cpu_offload")));
    }
    c_.engine.offload.optimizer = *on;
    set_by("EngineOptions.offload.optimizer", z.path("cpu_offload"));
    if (*on) {
      c_.notes.push_back(fmt::format("{} = true: the optimizer offloaded to host memory (DeepSpeed's deprecated form "
                                     "of offload_optimizer.device = cpu)",
                                     z.path("cpu_offload")));
    }
  }

  // MiCS shards within groups of mics_shard_size ranks and replicates across them: hybrid sharding,
  // the layout's shard, from which the program's mesh splits the groups (the engine takes communicators).
  void read_mics(ObjectReader& z) {
    if (const auto size = integer(z, "mics_shard_size", INT_MIN, INT_MAX); size && *size != -1) {
      if (*size < 1) {
        fail(ctx_, fmt::format("{} must be -1 (one group of the whole world) or a positive integer, got {}",
                               z.path("mics_shard_size"), *size));
      }
      c_.layout.shard = static_cast<int>(*size);
      set_by("shard=", z.path("mics_shard_size"));
    }
    note(z, "mics_hierarchical_params_gather", Kind::kBool,
         "the shard group's all-gather is one collective on its communicator");
  }

  // DeepSpeed sizes reductions and all-gathers separately; the engine's buckets serve both.
  void read_buckets(ObjectReader& z) {
    const auto reduce = integer(z, "reduce_bucket_size", 1, INT64_MAX);
    const auto gather = integer(z, "allgather_bucket_size", 1, INT64_MAX);
    if (reduce && gather && *reduce != *gather) {
      fail(ctx_, fmt::format("zero_optimization.reduce_bucket_size ({}) and zero_optimization.allgather_bucket_size "
                             "({}) differ: the engine has one bucket size (layout.bucket_numel) for both",
                             *reduce, *gather));
    }
    if (reduce || gather) {
      c_.engine.layout.bucket_numel = static_cast<size_t>(reduce ? *reduce : *gather);
      set_by("layout.bucket_numel",
             reduce ? "zero_optimization.reduce_bucket_size" : "zero_optimization.allgather_bucket_size");
    }
  }

  void read_offload(ObjectReader& r, bool params) {
    const json* device = r.find("device");
    if (device == nullptr) fail(ctx_, fmt::format("{} is required (cpu or none)", r.path("device")));
    const std::string d = read_string(*device, r.path("device"), ctx_, "cpu or none");
    if (d == "nvme") {
      fail(ctx_, fmt::format("{} = nvme is not supported: NVMe offload (ZeRO-Infinity) is not implemented; the "
                             "offload tier is host memory (cpu)",
                             r.path("device")));
    }
    if (d != "cpu" && d != "none") fail(ctx_, fmt::format("{} must be cpu or none, got \"{}\"", r.path("device"), d));
    (params ? c_.engine.offload.params : c_.engine.offload.optimizer) = d == "cpu";
    set_by(params ? "EngineOptions.offload.params" : "EngineOptions.offload.optimizer", r.path("device"));
    if (const auto pin = boolean(r, "pin_memory")) {
      if (pinned_from_ && *pin != c_.engine.offload.pinned_staging) {
        fail(ctx_, fmt::format("{} and {} differ: the engine has one staging setting (offload.pinned_staging)",
                               *pinned_from_, r.path("pin_memory")));
      }
      c_.engine.offload.pinned_staging = *pin;
      pinned_from_ = r.path("pin_memory");
    }
    if (!params) require_number(r, "ratio", 1.0, "partial offload is not implemented: the whole optimizer moves");
    const char* nvme = "it configures NVMe offload, which is not implemented";
    note(r, "nvme_path", Kind::kAny, nvme);
    note(r, "buffer_count", Kind::kCount, nvme);
    if (params) {
      note(r, "buffer_size", Kind::kCount, nvme);
      note(r, "max_in_cpu", Kind::kCount, nvme);
    } else {
      note(r, "fast_init", Kind::kBool, nvme);
    }
  }

  // DeepSpeed counts these in elements; the engine's limits are bytes of the model dtype.
  void read_stage3(ObjectReader& z) {
    const size_t element = c_.model_dtype ? dtype_size(*c_.model_dtype) : 4;
    auto bytes = [&](const char* key, size_t& field, const char* our_name, const char* zero_note) {
      const auto count = integer(z, key, 0, INT64_MAX);
      if (!count) return;
      const std::string path = z.path(key);
      // Our format reads sizes up to INT64_MAX: keep the bytes within it, so the result can be written out.
      if (*count > INT64_MAX / static_cast<int64_t>(element)) {
        fail(ctx_, fmt::format("{} = {} elements is too large", path, *count));
      }
      field = static_cast<size_t>(*count) * element;
      set_by(our_name, path);
      if (*count == 0 && zero_note != nullptr) c_.notes.push_back(fmt::format("{}: 0 means {}", path, zero_note));
      if (c_.engine.stage != 3) c_.notes.push_back(fmt::format("{}: no effect below stage 3", path));
    };
    bytes("stage3_prefetch_bucket_size", c_.engine.prefetch_bytes, "prefetch_bytes",
          "prefetch_bytes = 0: one unit ahead (the engine always prefetches)");
    bytes("stage3_param_persistence_threshold", c_.engine.param_persistence_bytes, "param_persistence_bytes", nullptr);
    bytes("stage3_max_live_parameters", c_.engine.max_live_gathered_bytes, "max_live_gathered_bytes",
          "max_live_gathered_bytes = 0: a gather window of two of the largest unit");
  }

  // ---- communication and the rest ----

  void read_communication(ObjectReader& top) {
    if (const auto t = dtype(top, "communication_data_type")) {
      c_.engine.reduce_dtype = *t;
      set_by("EngineOptions.reduce_dtype", "communication_data_type");
    }
    with(top, "data_types", [&](ObjectReader& r) {
      if (const auto t = dtype(r, "grad_accum_dtype")) {
        c_.engine.grad_accum_dtype = *t;
        set_by("EngineOptions.grad_accum_dtype", "data_types.grad_accum_dtype");
      }
    });
    require(top, "prescale_gradients", false, "the engine averages in the reduction itself");
    require_number(top, "gradient_predivide_factor", 1.0, "the engine averages in the reduction itself");
    if (const json* op = top.find("gradient_allreduce_op")) {
      const std::string v = read_string(*op, top.path("gradient_allreduce_op"), ctx_, "\"mean\"");
      if (v != "mean")
        fail(ctx_, fmt::format("gradient_allreduce_op = \"{}\" is not supported: the engine averages "
                               "gradients over ranks (\"mean\")",
                               v));
    }
  }

  void read_misc(ObjectReader& top) {
    refuse(top, "scheduler",
           "learning-rate schedules belong to the training loop (optim/lr_schedule.h sets each "
           "group's lr through Engine::param_group)");
    refuse(top, "amp", "NVIDIA Apex AMP is not supported; use fp16 or bf16");
    read_activation_checkpointing(top);
    note(top, "wall_clock_breakdown", Kind::kBool, "Engine::step_timings() always measures the step's parts");
    note(top, "zero_allow_untested_optimizer", Kind::kBool, "every optimizer the engine has is supported");
    note(top, "zero_force_ds_cpu_optimizer", Kind::kBool, "the offloaded optimizer is always the engine's own");
    for (const char* monitor : {"tensorboard", "wandb", "csv_monitor", "comms_logger", "flops_profiler"}) {
      note(top, monitor, Kind::kAny, "the engine has no monitoring back ends");
    }
  }

  // Activation checkpointing is the model's: the section says the model recomputes its blocks, which
  // is the layout's recompute (a program that can, as train_gpt, reads it there); how DeepSpeed
  // partitions or offloads the kept activations has no counterpart here.
  void read_activation_checkpointing(ObjectReader& top) {
    const json* j = top.find("activation_checkpointing");
    if (j == nullptr) return;
    const std::string path = top.path("activation_checkpointing");
    if (ctx_.strict) {
      fail(ctx_, fmt::format("{} is the model's (strict reading): set the layout's recompute instead", path));
    }
    with(top, "activation_checkpointing", [&](ObjectReader& a) {
      for (const char* key : {"partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
                              "synchronize_checkpoint_boundary", "profile"}) {
        note(a, key, Kind::kBool, "the program keeps each recomputed block's input whole, on its device");
      }
      note(a, "number_checkpoints", Kind::kCount, "the program recomputes every block");
    });
    c_.layout.recompute = true;
    c_.notes.push_back(fmt::format("{}: the layout's recompute: each block's forward runs again in its backward "
                                   "where the program recomputes (train_gpt does)",
                                   path));
  }

  EngineConfig& c_;
  const Context& ctx_;
  Origins origins_;
  std::optional<std::string> pinned_from_;  // the first pin_memory key read
  bool cpu_offload_ = false;                // zero_optimization.cpu_offload was given
};

}  // namespace

EngineConfig deepspeed_from(const json& root, const std::string& source_name, bool strict) {
  EngineConfig c;
  c.format = ConfigFormat::kDeepSpeed;
  c.source = source_name + " (deepspeed)";
  const Context ctx{.source = c.source, .strict = strict};
  DeepSpeedReader(c, ctx).read(root);
  return c;
}

}  // namespace zero::config_internal
