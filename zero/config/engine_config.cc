#include "zero/config/engine_config.h"

// The public front: format detection and the entry points. The parts each have their own file:
// json_reading (the strict text and key reading both formats share), native_format (ours),
// deepspeed_format (DeepSpeed's translated), config_validation (the checks every result passes).
#include <climits>
#include <cstdint>

#include "base/check.h"
#include "zero/config/config_validation.h"
#include "zero/config/deepspeed_format.h"
#include "zero/config/json_reading.h"
#include "zero/config/native_format.h"

namespace zero {
namespace {

using config_internal::deepspeed_from;
using config_internal::json;
using config_internal::parse_json;

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
  const config_internal::Context ctx{c.source};
  config_internal::read_native(root, ctx, c);
  config_internal::validate_config(c, ctx);
  return c;
}

}  // namespace

EngineConfig parse_engine_config(std::string_view json_text, const std::string& source_name, ConfigReading reading) {
  const json root = parse_json(json_text, source_name);
  return looks_like_deepspeed(root) ? deepspeed_from(root, source_name, reading.strict) : native_from(root, source_name);
}

EngineConfig parse_native_config(std::string_view json_text, const std::string& source_name) {
  return native_from(parse_json(json_text, source_name), source_name);
}

EngineConfig parse_deepspeed_config(std::string_view json_text, const std::string& source_name, ConfigReading reading) {
  return deepspeed_from(parse_json(json_text, source_name), source_name, reading.strict);
}

EngineConfig load_engine_config(const std::string& path, ConfigReading reading) {
  return parse_engine_config(config_internal::read_text_file(path, "config file"), path, reading);
}

std::string to_native_json(const EngineConfig& config) { return config_internal::write_native(config).dump(2) + "\n"; }

std::vector<std::string> native_config_keys() { return config_internal::native_keys(); }

int resolve_micro_batches(const EngineConfig& c, int data_parallel_size) {
  if (!c.loop.infer_micro_batches) return c.engine.micro_batches;
  ZERO_CHECK(data_parallel_size >= 1, "resolve_micro_batches: {} data-parallel ranks", data_parallel_size);
  ZERO_CHECK(c.loop.global_batch_size && c.loop.micro_batch_size, "{}: infer_micro_batches without both batch sizes",
             c.source);
  const int64_t per_step = static_cast<int64_t>(*c.loop.micro_batch_size) * data_parallel_size;
  if (*c.loop.global_batch_size % per_step != 0) {
    ZERO_THROW(InvalidArgument,
               "{}: the global batch (loop.global_batch_size, DeepSpeed's train_batch_size) {} is not a multiple of "
               "the micro batch (loop.micro_batch_size, train_micro_batch_size_per_gpu) {} x {} data-parallel "
               "rank(s), so the micro-batches per step (gradient_accumulation_steps) cannot be inferred",
               c.source, *c.loop.global_batch_size, *c.loop.micro_batch_size, data_parallel_size);
  }
  return static_cast<int>(*c.loop.global_batch_size / per_step);
}

std::optional<int> resolve_global_batch(const LoopConfig& loop, int micro_batches, int world_size) {
  if (micro_batches < 1 || world_size < 1) {
    ZERO_THROW(InvalidArgument, "resolve_global_batch: micro_batches ({}) and world_size ({}) must be >= 1",
               micro_batches, world_size);
  }
  const int64_t per_sample = static_cast<int64_t>(micro_batches) * world_size;
  if (loop.micro_batch_size) {
    const int64_t global = *loop.micro_batch_size * per_sample;
    if (loop.global_batch_size && *loop.global_batch_size != global) {
      ZERO_THROW(InvalidArgument,
                 "the global batch (loop.global_batch_size, DeepSpeed's train_batch_size) is {}, but the micro batch "
                 "(loop.micro_batch_size, train_micro_batch_size_per_gpu) {} x micro_batches {} x {} "
                 "rank(s) is {}",
                 *loop.global_batch_size, *loop.micro_batch_size, micro_batches, world_size, global);
    }
    if (global > INT_MAX) ZERO_THROW(InvalidArgument, "the global batch {} is too large", global);
    return static_cast<int>(global);
  }
  if (loop.global_batch_size) {
    if (*loop.global_batch_size % per_sample != 0) {
      ZERO_THROW(InvalidArgument,
                 "the global batch (loop.global_batch_size, DeepSpeed's train_batch_size) {} is not a multiple of "
                 "micro_batches {} x {} rank(s)",
                 *loop.global_batch_size, micro_batches, world_size);
    }
    return loop.global_batch_size;
  }
  return std::nullopt;
}

}  // namespace zero
