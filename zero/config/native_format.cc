#include "zero/config/native_format.h"

#include <fmt/format.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <optional>
#include <utility>

#include "base/check.h"
#include "base/cpu.h"
#include "layout/layout_json.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace zero::config_internal {
namespace {

LossScaling parse_loss_scaling(const std::string& name) {
  for (LossScaling s : {LossScaling::kNone, LossScaling::kStatic, LossScaling::kDynamic}) {
    if (name == loss_scaling_name(s)) return s;
  }
  ZERO_THROW(InvalidArgument, "unknown loss scaling '{}' (expected none, static or dynamic)", name);
}

// The JSON value of each field type of our format, both ways.
void read_value(const json& j, const std::string& p, const Context& c, int& v) { v = read_int(j, p, c); }
void read_value(const json& j, const std::string& p, const Context& c, bool& v) { v = read_bool(j, p, c); }
void read_value(const json& j, const std::string& p, const Context& c, float& v) { v = read_float(j, p, c); }
void read_value(const json& j, const std::string& p, const Context& c, size_t& v) {
  v = static_cast<size_t>(read_integer(j, p, c, 0, INT64_MAX));
}
void read_value(const json& j, const std::string& p, const Context& c, DType& v) {
  v = read_name(j, p, c, "a dtype name (fp32, fp16, bf16)", parse_dtype);
}
void read_value(const json& j, const std::string& p, const Context& c, optim::OptimizerKind& v) {
  v = read_name(j, p, c, "an optimizer name (adamw, adam, sgd, adagrad, lion, muon, adamw8bit, adafactor)", optim::parse_optimizer);
}
void read_value(const json& j, const std::string& p, const Context& c, LossScaling& v) {
  v = read_name(j, p, c, "none, static or dynamic", parse_loss_scaling);
}
void read_value(const json& j, const std::string& p, const Context& c, MicroBatchReduce& v) {
  v = read_name(j, p, c, "\"default\", \"each\" or \"once\"", parse_micro_batch_reduce);
}
void read_value(const json& j, const std::string& p, const Context& c, MicroBatchGather& v) {
  v = read_name(j, p, c, "\"default\", \"each\" or \"once\"", parse_micro_batch_gather);
}
void read_value(const json& j, const std::string& p, const Context& c, SimdPath& v) {
  v = read_name(j, p, c, "scalar, avx2 or avx512", parse_simd_path);
}
void read_value(const json& j, const std::string& p, const Context& c, std::vector<std::string>& v) {
  if (!j.is_array()) fail_type(j, p, c, "an array of strings");
  v.clear();
  for (size_t i = 0; i < j.size(); ++i) v.push_back(read_string(j[i], fmt::format("{}[{}]", p, i), c, "a string"));
}
void read_value(const json& j, const std::string& p, const Context& c, std::chrono::milliseconds& v) {
  v = std::chrono::milliseconds(read_integer(j, p, c, 1, INT64_MAX));
}
template <typename T>
void read_value(const json& j, const std::string& p, const Context& c, std::optional<T>& v) {
  if (j.is_null()) {
    v.reset();
    return;
  }
  T value{};
  read_value(j, p, c, value);
  v = value;
}

using ordered_json = nlohmann::ordered_json;

// Floats are written in their shortest form that reads back to the same float (0.1, not
// 0.10000000149011612).
ordered_json write_value(float v) { return std::stod(fmt::format("{}", v)); }
ordered_json write_value(int v) { return v; }
ordered_json write_value(bool v) { return v; }
ordered_json write_value(size_t v) { return static_cast<uint64_t>(v); }
ordered_json write_value(DType v) { return dtype_name(v); }
ordered_json write_value(optim::OptimizerKind v) { return optim::optimizer_name(v); }
ordered_json write_value(LossScaling v) { return loss_scaling_name(v); }
ordered_json write_value(SimdPath v) { return simd_path_name(v); }
ordered_json write_value(MicroBatchReduce v) { return micro_batch_policy_name(v); }
ordered_json write_value(MicroBatchGather v) { return micro_batch_policy_name(v); }
ordered_json write_value(std::chrono::milliseconds v) { return static_cast<int64_t>(v.count()); }
ordered_json write_value(const std::vector<std::string>& v) { return v; }

// ---------------------------------------------------------------------------------------------
// Our format: one description of the fields, walked by a reader, a writer and a key lister, so the
// three cannot disagree.

template <typename V>
void visit_hyper(V& v, optim::Hyper& h) {
  v.field("kind", h.kind);
  v.field("params", h.params);
  v.field("lr", h.lr);
  v.field("weight_decay", h.weight_decay);
  v.field("beta1", h.beta1);
  v.field("beta2", h.beta2);
  v.field("eps", h.eps);
  v.field("momentum", h.momentum);
  v.field("dampening", h.dampening);
  v.field("nesterov", h.nesterov);
  v.field("lr_decay", h.lr_decay);
  v.field("initial_accumulator_value", h.initial_accumulator_value);
  v.object("muon", [&] {
    v.field("momentum", h.muon.momentum);
    v.field("nesterov", h.muon.nesterov);
    v.field("ns_steps", h.muon.ns_steps);
    v.field("rms_scale", h.muon.rms_scale);
    v.field("per_part", h.muon.per_part);
    v.field("bf16", h.muon.bf16);
  });
  v.object("adafactor", [&] {
    v.field("eps1", h.adafactor.eps1);
    v.field("eps2", h.adafactor.eps2);
    v.field("clip_threshold", h.adafactor.clip_threshold);
    v.field("decay_rate", h.adafactor.decay_rate);
    v.field("relative_step", h.adafactor.relative_step);
    v.field("beta1", h.adafactor.beta1);
  });
}

template <typename V>
void visit_native(V& v, EngineConfig& c) {
  EngineOptions& o = c.engine;
  v.field("stage", o.stage);
  v.object("optimizer", [&] {
    v.field("kind", o.optimizer.kind);
    v.array("groups", o.optimizer.groups, [&](optim::Hyper& h) { visit_hyper(v, h); });
    v.field("state_dtype", o.optimizer.state_dtype);
    v.field("num_threads", o.optimizer.num_threads);
    v.field("simd_path", o.optimizer.simd_path);
    v.field("quant_block", o.optimizer.quant_block);
    v.field("quant_min_numel", o.optimizer.quant_min_numel);
  });
  v.field("max_grad_norm", o.max_grad_norm);
  v.field("param_dtype", o.param_dtype);
  v.field("reduce_dtype", o.reduce_dtype);
  v.field("grad_accum_dtype", o.grad_accum_dtype);
  v.field("micro_batches", o.micro_batches);
  v.field("micro_batch_reduce", o.micro_batch_reduce);
  v.field("micro_batch_gather", o.micro_batch_gather);
  v.field("deterministic", o.deterministic);
  v.field("loss_scaling", o.loss_scaling);
  v.field("static_loss_scale", o.static_loss_scale);
  v.object("dynamic_loss_scaler", [&] {
    optim::LossScalerOptions& d = o.dynamic_loss_scaler;
    v.field("initial_scale", d.initial_scale);
    v.field("growth_factor", d.growth_factor);
    v.field("backoff_factor", d.backoff_factor);
    v.field("growth_interval", d.growth_interval);
    v.field("hysteresis", d.hysteresis);
    v.field("min_scale", d.min_scale);
    v.field("consecutive_hysteresis", d.consecutive_hysteresis);
  });
  v.object("layout", [&] {
    v.field("alignment", o.layout.alignment);
    v.field("bucket_numel", o.layout.bucket_numel);
    v.field("block", o.layout.block);
    v.field("whole_tensors", o.layout.whole_tensors);
  });
  v.field("max_inflight_buckets", o.max_inflight_buckets);
  v.field("reshard_after_forward", o.reshard_after_forward);
  v.field("prefetch_bytes", o.prefetch_bytes);
  v.field("max_live_gathered_bytes", o.max_live_gathered_bytes);
  v.field("param_persistence_bytes", o.param_persistence_bytes);
  v.object("quantized_weights", [&] {
    v.field("bits", o.quantized_weights.bits);
    v.field("block", o.quantized_weights.block);
    v.field("backward", o.quantized_weights.backward);
    v.field("evaluation", o.quantized_weights.evaluation);
  });
  v.field("node_size", o.node_size);
  v.field("secondary_shard", o.secondary_shard);
  v.object("quantized_gradients", [&] {
    v.field("bits", o.quantized_gradients.bits);
    v.field("block", o.quantized_gradients.block);
    v.field("stochastic", o.quantized_gradients.stochastic);
  });
  v.object("offload", [&] {
    v.field("optimizer", o.offload.optimizer);
    v.field("params", o.offload.params);
    v.field("pinned_staging", o.offload.pinned_staging);
  });
  v.field("replica_check_every", o.replica_check_every);
  v.field("timeout_ms", o.timeout);
  v.field("model_dtype", c.model_dtype);
  v.object("loop", [&] {
    v.field("micro_batch_size", c.loop.micro_batch_size);
    v.field("global_batch_size", c.loop.global_batch_size);
    v.field("log_every", c.loop.log_every);
    v.field("infer_micro_batches", c.loop.infer_micro_batches);
  });
  v.layout("parallel", c.layout);
}

class NativeReader {
 public:
  explicit NativeReader(ObjectReader& top) : cur_(&top) {}

  template <typename T>
  void field(const char* key, T& value) {
    if (const json* j = cur_->find(key)) read_value(*j, cur_->path(key), cur_->ctx(), value);
  }
  template <typename F>
  void object(const char* key, F&& body) {
    const json* j = cur_->find(key);
    if (j == nullptr) return;
    ObjectReader child(*j, cur_->path(key), cur_->ctx());
    inside(child, body);
  }
  // The layout's reader (layout/layout_json.h), over the fields a config's "parallel" section holds.
  void layout(const char* key, Layout& l) {
    const json* j = cur_->find(key);
    if (j == nullptr) return;
    try {
      l = read_layout_json(*j, cur_->path(key), LayoutFields::kParallel, l);
    } catch (const InvalidArgument& e) {
      fail(cur_->ctx(), e.what());
    }
  }
  // A present array replaces the list; each element starts from T's defaults.
  template <typename T, typename F>
  void array(const char* key, std::vector<T>& items, F&& body) {
    const json* j = cur_->find(key);
    if (j == nullptr) return;
    const std::string path = cur_->path(key);
    if (!j->is_array() || j->empty()) fail_type(*j, path, cur_->ctx(), "a non-empty array of objects");
    items.assign(j->size(), T{});
    for (size_t i = 0; i < items.size(); ++i) {
      ObjectReader child((*j)[i], fmt::format("{}[{}]", path, i), cur_->ctx());
      inside(child, [&] { body(items[i]); });
    }
  }

 private:
  template <typename F>
  void inside(ObjectReader& child, F&& body) {
    ObjectReader* parent = cur_;
    cur_ = &child;
    body();
    child.finish();
    cur_ = parent;
  }

  ObjectReader* cur_;
};

class NativeWriter {
 public:
  explicit NativeWriter(ordered_json& top) : cur_(&top) {}

  template <typename T>
  void field(const char* key, T& value) {
    (*cur_)[key] = write_value(value);
  }
  template <typename T>
  void field(const char* key, std::optional<T>& value) {
    if (value) (*cur_)[key] = write_value(*value);
  }
  template <typename F>
  void object(const char* key, F&& body) {
    (*cur_)[key] = inside(body);
  }
  void layout(const char* key, Layout& l) { (*cur_)[key] = layout_json(l, LayoutFields::kParallel); }
  template <typename T, typename F>
  void array(const char* key, std::vector<T>& items, F&& body) {
    ordered_json list = ordered_json::array();
    for (T& item : items) list.push_back(inside([&] { body(item); }));
    (*cur_)[key] = std::move(list);
  }

 private:
  template <typename F>
  ordered_json inside(F&& body) {
    ordered_json child = ordered_json::object();
    ordered_json* parent = cur_;
    cur_ = &child;
    body();
    cur_ = parent;
    return child;
  }

  ordered_json* cur_;
};

class KeyLister {
 public:
  template <typename T>
  void field(const char* key, T&) {
    keys.push_back(prefix_ + key);
  }
  template <typename F>
  void object(const char* key, F&& body) {
    nested(std::string(key) + ".", body);
  }
  void layout(const char* key, Layout&) {
    for (const std::string& f : layout_fields()) {
      if (!is_engine_field(f)) keys.push_back(prefix_ + key + "." + f);
    }
  }
  template <typename T, typename F>
  void array(const char* key, std::vector<T>&, F&& body) {
    T item{};
    nested(std::string(key) + "[].", [&] { body(item); });
  }

  std::vector<std::string> keys;

 private:
  template <typename F>
  void nested(const std::string& part, F&& body) {
    const std::string saved = prefix_;
    prefix_ += part;
    body();
    prefix_ = saved;
  }

  std::string prefix_;
};


}  // namespace

void read_native(const json& root, const Context& ctx, EngineConfig& c) {
  ObjectReader top(root, "", ctx);
  NativeReader reader(top);
  visit_native(reader, c);
  top.finish();
}

ordered_json write_native(const EngineConfig& config) {
  EngineConfig c = config;  // the visitor takes fields by reference; the writer only reads them
  ordered_json root = ordered_json::object();
  NativeWriter writer(root);
  visit_native(writer, c);
  return root;
}

std::vector<std::string> native_keys() {
  EngineConfig c;
  KeyLister lister;
  visit_native(lister, c);
  return lister.keys;
}

}  // namespace zero::config_internal
