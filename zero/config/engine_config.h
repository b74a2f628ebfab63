#pragma once
// EngineOptions from a JSON file: our own format (the struct's field names, nested as in the struct)
// or a DeepSpeed config (ds_config.json), told apart by their keys. docs/config.md is the reference:
// every key, its type and default, and how each DeepSpeed key maps.
//
// Nothing is silently ignored: an unknown key, at any level, is an error naming its full path and
// the nearest known key at that level; a value of the wrong type names the key and the type
// expected; a DeepSpeed setting the engine cannot honour is refused with the reason. DeepSpeed keys
// that are accepted but change nothing here (e.g. sub_group_size) are listed in EngineConfig::notes
// for the program to print. Every result is validated (zero::validate and the optimizer's and loss
// scaler's own checks), so out-of-range values fail naming the field. All errors are
// InvalidArgument, except IoError for a file that cannot be read.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero/config/engine_config_types.h"  // EngineConfig, LoopConfig, ConfigFormat

namespace zero {

// How DeepSpeed keys that belong to the model or to logging, or change nothing here, are taken:
// accepted, each with a line in EngineConfig::notes saying how it maps (activation_checkpointing to
// the layout's recompute) or why it has no effect (the default, so that users' configs run as
// they have them), or, strict, refused naming the key: a file every key of which must take effect.
// Unknown keys are refused either way.
struct ConfigReading {
  bool strict = false;
};

// Reads either format: DeepSpeed's when the top level has zero_optimization, fp16, bf16,
// gradient_clipping, train_batch_size, train_micro_batch_size_per_gpu or steps_per_print, or an
// "optimizer" object with a "type"; ours otherwise. `source_name` (a file name) starts every error.
EngineConfig parse_engine_config(std::string_view json_text, const std::string& source_name,
                                 ConfigReading reading = {});
EngineConfig parse_native_config(std::string_view json_text, const std::string& source_name);
EngineConfig parse_deepspeed_config(std::string_view json_text, const std::string& source_name,
                                   ConfigReading reading = {});

// parse_engine_config of a file's contents; IoError naming the file when it cannot be read.
EngineConfig load_engine_config(const std::string& path, ConfigReading reading = {});

// Our format with every key (a loop or model dtype that is unset is left out): what
// parse_native_config reads back to the same config. Pretty-printed with two-space indents.
std::string to_native_json(const EngineConfig& config);

// Every key path our format accepts, in document order: "stage", "optimizer.kind",
// "optimizer.groups[].lr", ..., "loop.log_every".
std::vector<std::string> native_config_keys();

// DeepSpeed's batch rule, global = micro * micro_batches (its gradient_accumulation_steps) * world_size: the global batch
// from whichever of loop.global_batch_size and loop.micro_batch_size is given, checked against the
// other when both are; nullopt when neither is. InvalidArgument names the keys that disagree, or a
// global batch that does not divide by micro_batches * world_size.
std::optional<int> resolve_global_batch(const LoopConfig& loop, int micro_batches, int world_size);

// The micro-batches per step on `data_parallel_size` ranks: with loop.infer_micro_batches (DeepSpeed's
// train_batch_size and train_micro_batch_size_per_gpu without gradient_accumulation_steps),
// global / (micro x data_parallel_size); otherwise engine.micro_batches as the file gives it.
// InvalidArgument naming the file, both keys and the rank count when the global batch does not
// divide.
int resolve_micro_batches(const EngineConfig& config, int data_parallel_size);

}  // namespace zero
