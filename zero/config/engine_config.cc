#include "zero/config/engine_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "base/check.h"
#include "base/cpu.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace zero {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Errors and key paths

// What every error of one parse starts with: the file, and once known its format.
struct Context {
  std::string source;
};

[[noreturn]] void fail(const Context& ctx, const std::string& message) {
  ZERO_THROW(InvalidArgument, "{}: {}", ctx.source, message);
}

std::string join_path(std::string_view parent, std::string_view key) {
  return parent.empty() ? std::string(key) : fmt::format("{}.{}", parent, key);
}

// A value as the user wrote it, for error messages ("\"12\" (a string)"). Arrays and objects are
// only named: printing them would be as deep and as long as the input.
std::string describe(const json& j) {
  switch (j.type()) {
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::string: {
      std::string text = j.dump();
      if (text.size() > 40) text = text.substr(0, 36) + "...\"";
      return text + " (a string)";
    }
    default: return j.dump();
  }
}

// HuggingFace's Trainer replaces "auto" with values it computes; read without it, they mean nothing.
void check_not_auto(const json& j, const std::string& path, const Context& ctx) {
  if (j.is_string() && j.get_ref<const std::string&>() == "auto") {
    fail(ctx, fmt::format("{} is \"auto\": \"auto\" values are filled in by HuggingFace's Trainer and must be "
                          "resolved to a value before the engine reads the config",
                          path));
  }
}

[[noreturn]] void fail_type(const json& j, const std::string& path, const Context& ctx, std::string_view expected) {
  check_not_auto(j, path, ctx);
  fail(ctx, fmt::format("{} must be {}, got {}", path, expected, describe(j)));
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 0; i < a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i + 1;
    for (size_t j = 0; j < b.size(); ++j) {
      const size_t up = row[j + 1];
      row[j + 1] = std::min({up + 1, row[j] + 1, diagonal + (a[i] == b[j] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// One JSON object of the config. Every key the parser looks up (present or not) becomes known, so
// finish() can refuse the keys nobody asked for, suggesting the nearest known one.
class ObjectReader {
 public:
  ObjectReader(const json& j, std::string path, const Context& ctx) : j_(j), path_(std::move(path)), ctx_(ctx) {
    if (!j.is_object()) fail_type(j, path_.empty() ? "the top level" : path_, ctx, "an object");
  }

  const json* find(const std::string& key) {
    known_.push_back(key);
    const auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  std::string path(std::string_view key) const { return join_path(path_, key); }
  const Context& ctx() const { return ctx_; }

  void finish() const {
    for (const auto& item : j_.items()) {
      if (std::find(known_.begin(), known_.end(), item.key()) != known_.end()) continue;
      std::string message = fmt::format("unknown key {}", path(item.key()));
      if (const std::string* near = nearest(item.key())) message += fmt::format(" (did you mean {}?)", path(*near));
      fail(ctx_, message + "; docs/config.md lists the keys");
    }
  }

 private:
  const std::string* nearest(const std::string& key) const {
    const std::string* best = nullptr;
    size_t best_distance = SIZE_MAX;
    for (const std::string& k : known_) {
      const size_t d = edit_distance(key, k);
      if (d < best_distance) best = &k, best_distance = d;
    }
    return best;
  }

  const json& j_;
  std::string path_;
  const Context& ctx_;
  std::vector<std::string> known_;
};

// ---------------------------------------------------------------------------------------------
// Values

bool read_bool(const json& j, const std::string& path, const Context& ctx) {
  if (!j.is_boolean()) fail_type(j, path, ctx, "true or false");
  return j.get<bool>();
}

double read_number(const json& j, const std::string& path, const Context& ctx) {
  if (!j.is_number()) fail_type(j, path, ctx, "a number");
  return j.get<double>();
}

float read_float(const json& j, const std::string& path, const Context& ctx) {
  const double d = read_number(j, path, ctx);
  const float f = static_cast<float>(d);
  if (!std::isfinite(f)) fail(ctx, fmt::format("{} = {} is outside the range of a 32-bit float", path, d));
  return f;
}

std::string read_string(const json& j, const std::string& path, const Context& ctx, std::string_view expected) {
  if (!j.is_string()) fail_type(j, path, ctx, expected);
  check_not_auto(j, path, ctx);
  return j.get<std::string>();
}

// An integer in [lo, hi]. A float that is a whole number (DeepSpeed configs write 5e8) counts.
int64_t read_integer(const json& j, const std::string& path, const Context& ctx, int64_t lo, int64_t hi) {
  const char* expected = lo == 0 ? "a non-negative integer" : lo == 1 ? "a positive integer" : "an integer";
  auto below = [&] {
    if (lo == 0 || lo == 1) fail_type(j, path, ctx, expected);
    fail(ctx, fmt::format("{} must be at least {}, got {}", path, lo, j.dump()));
  };
  auto above = [&] { fail(ctx, fmt::format("{} must be at most {}, got {}", path, hi, j.dump())); };
  if (!j.is_number()) fail_type(j, path, ctx, expected);
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (d != std::floor(d)) fail_type(j, path, ctx, expected);  // a fraction
    if (d < static_cast<double>(lo)) below();
    if (d > static_cast<double>(hi) || d >= 0x1p63) above();
    return static_cast<int64_t>(d);
  }
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) above();
    if (static_cast<int64_t>(u) < lo) below();
    return static_cast<int64_t>(u);
  }
  const int64_t v = j.get<int64_t>();
  if (v < lo) below();
  if (v > hi) above();
  return v;
}

int read_int(const json& j, const std::string& path, const Context& ctx, int lo = INT_MIN, int hi = INT_MAX) {
  return static_cast<int>(read_integer(j, path, ctx, lo, hi));
}

// A name parsed by one of the library's parse_* functions, whose error gets the key in front.
template <typename Parse>
auto read_name(const json& j, const std::string& path, const Context& ctx, std::string_view expected, Parse parse) {
  const std::string name = read_string(j, path, ctx, expected);
  try {
    return parse(name);
  } catch (const InvalidArgument& e) {
    fail(ctx, fmt::format("{}: {}", path, e.what()));
  }
}

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
  v = read_name(j, p, c, "an optimizer name (adamw, adam, sgd, adagrad, lion)", optim::parse_optimizer);
}
void read_value(const json& j, const std::string& p, const Context& c, LossScaling& v) {
  v = read_name(j, p, c, "none, static or dynamic", parse_loss_scaling);
}
void read_value(const json& j, const std::string& p, const Context& c, SimdPath& v) {
  v = read_name(j, p, c, "scalar, avx2 or avx512", parse_simd_path);
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
ordered_json write_value(std::chrono::milliseconds v) { return static_cast<int64_t>(v.count()); }

// ---------------------------------------------------------------------------------------------
// Our format: one description of the fields, walked by a reader, a writer and a key lister, so the
// three cannot disagree.

template <typename V>
void visit_hyper(V& v, optim::Hyper& h) {
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
  });
  v.field("max_grad_norm", o.max_grad_norm);
  v.field("reduce_dtype", o.reduce_dtype);
  v.field("grad_accum_dtype", o.grad_accum_dtype);
  v.field("gradient_accumulation_steps", o.gradient_accumulation_steps);
  v.field("reduce_every_micro_step", o.reduce_every_micro_step);
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
  });
  v.field("max_inflight_buckets", o.max_inflight_buckets);
  v.field("reshard_after_forward", o.reshard_after_forward);
  v.field("prefetch_bytes", o.prefetch_bytes);
  v.field("max_live_gathered_bytes", o.max_live_gathered_bytes);
  v.field("param_persistence_bytes", o.param_persistence_bytes);
  v.object("offload", [&] {
    v.field("optimizer", o.offload.optimizer);
    v.field("params", o.offload.params);
    v.field("pinned_staging", o.offload.pinned_staging);
  });
  v.field("timeout_ms", o.timeout);
  v.field("model_dtype", c.model_dtype);
  v.object("loop", [&] {
    v.field("micro_batch_size", c.loop.micro_batch_size);
    v.field("global_batch_size", c.loop.global_batch_size);
    v.field("log_every", c.loop.log_every);
  });
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

// ---------------------------------------------------------------------------------------------
// Validation of the result

// (text an error names, the DeepSpeed key that set it): appended to a validation error, so that it
// names the key in the file as well as the option.
using Origins = std::vector<std::pair<std::string, std::string>>;

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

void validate_config(const EngineConfig& c, const Context& ctx, const Origins& origins = {}) {
  const EngineOptions& o = c.engine;
  checked(ctx, origins, "", [&] { validate(o); });
  checked(ctx, origins, "optimizer.", [&] {
    if (o.optimizer.groups.empty()) ZERO_THROW(InvalidArgument, "groups must not be empty");
    for (size_t g = 0; g < o.optimizer.groups.size(); ++g) {
      optim::validate_hyper(o.optimizer.kind, o.optimizer.groups[g], static_cast<int>(g));
    }
    if (o.optimizer.state_dtype != DType::kFloat32 && o.optimizer.state_dtype != DType::kBFloat16) {
      ZERO_THROW(InvalidArgument, "state_dtype must be fp32 or bf16, got {}", dtype_name(o.optimizer.state_dtype));
    }
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
    for (const auto& [name, value] :
         {std::pair{"micro_batch_size", c.loop.micro_batch_size},
          std::pair{"global_batch_size", c.loop.global_batch_size}, std::pair{"log_every", c.loop.log_every}}) {
      if (value && *value < 1) ZERO_THROW(InvalidArgument, "loop.{} must be >= 1, got {}", name, *value);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// DeepSpeed's format

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
  // Accepted, type-checked, and listed in the notes with the reason it changes nothing here.
  void note(ObjectReader& r, const char* key, Kind kind, std::string_view why) {
    const json* j = r.find(key);
    if (j == nullptr) return;
    const std::string path = r.path(key);
    if (kind == Kind::kBool) read_bool(*j, path, ctx_);
    if (kind == Kind::kCount) read_integer(*j, path, ctx_, 0, INT64_MAX);
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
    if (steps) c_.engine.gradient_accumulation_steps = static_cast<int>(*steps);
    if (global && micro && !steps) {
      fail(ctx_,
           "train_batch_size and train_micro_batch_size_per_gpu without gradient_accumulation_steps: "
           "DeepSpeed infers it from the world size, which a config file is read without; give "
           "gradient_accumulation_steps too");
    }
    if (global && micro && *global % (*micro * *steps) != 0) {
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
      const std::string name = read_string(*type, r.path("type"), ctx_, "an optimizer name");
      const std::string t = lower(name);
      if (t != "adam" && t != "adamw" && t != "sgd" && t != "adagrad" && t != "lion") {
        fail(ctx_,
             fmt::format("optimizer.type \"{}\" is not supported (expected Adam, AdamW, SGD, Adagrad or Lion)", name));
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
    require(z, "cpu_offload", false, "deprecated in DeepSpeed; use zero_optimization.offload_optimizer.device = cpu");
    require(z, "zero_quantized_weights", false, "quantized collectives (ZeRO++) are not implemented");
    require(z, "zero_quantized_gradients", false, "quantized collectives (ZeRO++) are not implemented");
    if (const auto hpz = integer(z, "zero_hpz_partition_size", 1, INT_MAX); hpz && *hpz != 1) {
      fail(ctx_,
           "zero_optimization.zero_hpz_partition_size is not supported: hybrid sharding is chosen by giving "
           "the Engine a replica communicator, not by an option");
    }
    read_buckets(z);
    with(z, "offload_optimizer", [&](ObjectReader& r) { read_offload(r, false); });
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
    refuse(top, "activation_checkpointing", "activation checkpointing is the model's, outside the engine");
    note(top, "wall_clock_breakdown", Kind::kBool, "Engine::step_timings() always measures the step's parts");
    note(top, "zero_allow_untested_optimizer", Kind::kBool, "every optimizer the engine has is supported");
    note(top, "zero_force_ds_cpu_optimizer", Kind::kBool, "the offloaded optimizer is always the engine's own");
    for (const char* monitor : {"tensorboard", "wandb", "csv_monitor", "comms_logger", "flops_profiler"}) {
      note(top, monitor, Kind::kAny, "the engine has no monitoring back ends");
    }
  }

  EngineConfig& c_;
  const Context& ctx_;
  Origins origins_;
  std::optional<std::string> pinned_from_;  // the first pin_memory key read
};

// ---------------------------------------------------------------------------------------------
// JSON text

// The parser keeps the last of two equal keys; a config must not lose one silently, so the
// callback tracks the keys of every open object and refuses a repeat.
json parse_json(std::string_view text, const std::string& source) {
  struct Frame {
    bool object = false;
    std::set<std::string> keys;
  };
  std::vector<Frame> open;
  const Context ctx{source};
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open.push_back({true, {}}); break;
      case json::parse_event_t::array_start: open.push_back({false, {}}); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end: open.pop_back(); break;
      case json::parse_event_t::key:
        if (!open.back().keys.insert(parsed.get<std::string>()).second) {
          fail(ctx, fmt::format("key \"{}\" appears twice in one object", parsed.get<std::string>()));
        }
        break;
      case json::parse_event_t::value: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::parse_error& e) {
    fail(ctx, fmt::format("malformed JSON: {}", e.what()));
  } catch (const json::exception& e) {
    // E.g. a number beyond a double's range (1e999): the parser's out_of_range, not a parse_error.
    fail(ctx, fmt::format("unreadable JSON: {}", e.what()));
  }
}

bool looks_like_deepspeed(const json& j) {
  if (!j.is_object()) return false;
  for (const char* key : {"zero_optimization", "fp16", "bf16", "gradient_clipping", "train_batch_size",
                          "train_micro_batch_size_per_gpu", "steps_per_print"}) {
    if (j.contains(key)) return true;
  }
  const auto it = j.find("optimizer");
  return it != j.end() && it->is_object() && it->contains("type");
}

EngineConfig native_from(const json& root, const std::string& source_name) {
  EngineConfig c;
  c.format = ConfigFormat::kNative;
  c.source = source_name + " (ours)";
  const Context ctx{c.source};
  ObjectReader top(root, "", ctx);
  NativeReader reader(top);
  visit_native(reader, c);
  top.finish();
  validate_config(c, ctx);
  return c;
}

EngineConfig deepspeed_from(const json& root, const std::string& source_name) {
  EngineConfig c;
  c.format = ConfigFormat::kDeepSpeed;
  c.source = source_name + " (deepspeed)";
  const Context ctx{c.source};
  DeepSpeedReader(c, ctx).read(root);
  return c;
}

}  // namespace

EngineConfig parse_engine_config(std::string_view json_text, const std::string& source_name) {
  const json root = parse_json(json_text, source_name);
  return looks_like_deepspeed(root) ? deepspeed_from(root, source_name) : native_from(root, source_name);
}

EngineConfig parse_native_config(std::string_view json_text, const std::string& source_name) {
  return native_from(parse_json(json_text, source_name), source_name);
}

EngineConfig parse_deepspeed_config(std::string_view json_text, const std::string& source_name) {
  return deepspeed_from(parse_json(json_text, source_name), source_name);
}

EngineConfig load_engine_config(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) ZERO_THROW(IoError, "cannot read config file '{}': a directory", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) ZERO_THROW(IoError, "cannot open config file '{}': {}", path, std::strerror(errno));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) ZERO_THROW(IoError, "cannot read config file '{}': {}", path, std::strerror(errno));
  return parse_engine_config(text, path);
}

std::string to_native_json(const EngineConfig& config) {
  EngineConfig c = config;  // the visitor takes fields by reference; the writer only reads them
  ordered_json root = ordered_json::object();
  NativeWriter writer(root);
  visit_native(writer, c);
  return root.dump(2) + "\n";
}

std::vector<std::string> native_config_keys() {
  EngineConfig c;
  KeyLister lister;
  visit_native(lister, c);
  return lister.keys;
}

std::optional<int> resolve_global_batch(const LoopConfig& loop, int gradient_accumulation_steps, int world_size) {
  if (gradient_accumulation_steps < 1 || world_size < 1) {
    ZERO_THROW(InvalidArgument,
               "resolve_global_batch: gradient_accumulation_steps ({}) and world_size ({}) must be >= 1",
               gradient_accumulation_steps, world_size);
  }
  const int64_t per_sample = static_cast<int64_t>(gradient_accumulation_steps) * world_size;
  if (loop.micro_batch_size) {
    const int64_t global = *loop.micro_batch_size * per_sample;
    if (loop.global_batch_size && *loop.global_batch_size != global) {
      ZERO_THROW(InvalidArgument,
                 "the global batch (loop.global_batch_size, DeepSpeed's train_batch_size) is {}, but the micro batch "
                 "(loop.micro_batch_size, train_micro_batch_size_per_gpu) {} x gradient_accumulation_steps {} x {} "
                 "rank(s) is {}",
                 *loop.global_batch_size, *loop.micro_batch_size, gradient_accumulation_steps, world_size, global);
    }
    if (global > INT_MAX) ZERO_THROW(InvalidArgument, "the global batch {} is too large", global);
    return static_cast<int>(global);
  }
  if (loop.global_batch_size) {
    if (*loop.global_batch_size % per_sample != 0) {
      ZERO_THROW(InvalidArgument,
                 "the global batch (loop.global_batch_size, DeepSpeed's train_batch_size) {} is not a multiple of "
                 "gradient_accumulation_steps {} x {} rank(s)",
                 *loop.global_batch_size, gradient_accumulation_steps, world_size);
    }
    return loop.global_batch_size;
  }
  return std::nullopt;
}

}  // namespace zero
