#pragma once
// The result of reading a config file (engine_config.h reads it): the engine's options and what the
// program around the engine takes from the same file. A header of its own so that the reader's
// internal parts (zero/config/*_format.h, config_validation.h) can fill it without depending on the
// public front that depends on them.
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "layout/layout.h"
#include "zero/engine_options.h"

namespace zero {

// Settings of the training loop rather than the engine, which the examples read: DeepSpeed's
// train_micro_batch_size_per_gpu, train_batch_size and steps_per_print. Unset when not given.
struct LoopConfig {
  std::optional<int> micro_batch_size;   // samples per rank in one micro-step
  std::optional<int> global_batch_size;  // samples per optimizer step, over all ranks and micro-steps
  std::optional<int> log_every;          // steps between progress lines
  // DeepSpeed's train_batch_size and train_micro_batch_size_per_gpu without
  // gradient_accumulation_steps: the micro-batches per step follow from the world, global / (micro x
  // data-parallel ranks), which the program resolves once it knows it (resolve_micro_batches).
  bool infer_micro_batches = false;
};

enum class ConfigFormat { kNative, kDeepSpeed };

struct EngineConfig {
  EngineOptions engine;
  // The dtype the model's parameters are registered in (DeepSpeed: fp16 / bf16 enabled). The engine
  // takes it from each parameter, so this is for the program that registers them.
  std::optional<DType> model_dtype;
  LoopConfig loop;
  // The run's layout (layout/layout.h): the mesh the program builds (comm::Mesh(world, layout)), its
  // hybrid sharding groups (shard) and pipeline, from the file's "parallel" section (ours; DeepSpeed's
  // mics_shard_size gives the shard), dp 0 (the world's rest) unless given. Its stage, offload and
  // micro-batches are the engine's options above, copied in by the reader: a file says them once, with
  // the engine's keys (engine_options(layout, base) writes a layout's back).
  Layout layout{.dp = 0, .stage = EngineOptions{}.stage};
  ConfigFormat format = ConfigFormat::kNative;
  std::string source;  // "<name> (ours)" or "<name> (deepspeed)"
  // Keys accepted without effect, each with the reason ("zero_optimization.sub_group_size: ...").
  std::vector<std::string> notes;
};

}  // namespace zero
