#pragma once
// The result of reading a config file (engine_config.h reads it): the engine's options and what the
// program around the engine takes from the same file. A header of its own so that the reader's
// internal parts (zero/config/*_format.h, config_validation.h) can fill it without depending on the
// public front that depends on them.
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "zero/engine_options.h"

namespace zero {

// Settings of the training loop rather than the engine, which the examples read: DeepSpeed's
// train_micro_batch_size_per_gpu, train_batch_size and steps_per_print. Unset when not given.
struct LoopConfig {
  std::optional<int> micro_batch_size;   // samples per rank in one micro-step
  std::optional<int> global_batch_size;  // samples per optimizer step, over all ranks and micro-steps
  std::optional<int> log_every;          // steps between progress lines
};

// Hybrid sharding (HSDP; DeepSpeed's MiCS): state is sharded within groups of consecutive ranks and
// each group replicates the others. Not an engine option: the engine takes the shard and replica
// communicators (EngineComms), which the program splits from the world by this size
// (comm/hybrid_groups.h).
struct HybridConfig {
  // Ranks in one shard group; the world size must be a multiple of it. Unset: one group of the whole
  // world (plain sharding).
  std::optional<int> shard_group_size;
};

// The model-parallel layout: the mesh and pipeline the program builds around the engine (zero_plan
// --auto --write-config writes the layout it chooses). Not engine options: the engine takes the
// communicators (EngineComms) the program splits from the world by these sizes (comm/mesh.h), and the
// schedule is the pipeline runner's (parallel/pipeline/schedules.h names them and refuses others).
// Unset: the program's default (one rank of each, no pipeline, no recompute).
struct ParallelConfig {
  std::optional<int> dp;                   // data-parallel ranks: the world must be dp x tp x pp
  std::optional<int> tp;                   // tensor-parallel ranks per group (Megatron's split)
  std::optional<bool> sequence_parallel;   // the tp groups also split the residual stream's rows
  std::optional<int> pp;                   // pipeline stages
  std::optional<std::string> schedule;     // the pipeline's: gpipe, 1f1b, interleaved, zb-h1
  std::optional<int> chunks;               // model chunks per pipeline rank (interleaved)
  std::optional<bool> recompute;           // activation recompute: a block's forward again in its backward
};

enum class ConfigFormat { kNative, kDeepSpeed };

struct EngineConfig {
  EngineOptions engine;
  // The dtype the model's parameters are registered in (DeepSpeed: fp16 / bf16 enabled). The engine
  // takes it from each parameter, so this is for the program that registers them.
  std::optional<DType> model_dtype;
  LoopConfig loop;
  HybridConfig hybrid;
  ParallelConfig parallel;
  ConfigFormat format = ConfigFormat::kNative;
  std::string source;  // "<name> (ours)" or "<name> (deepspeed)"
  // Keys accepted without effect, each with the reason ("zero_optimization.sub_group_size: ...").
  std::vector<std::string> notes;
};

}  // namespace zero
