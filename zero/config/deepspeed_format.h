#pragma once
// Internal to zero/config: the translation of a DeepSpeed config (ds_config.json) into an
// EngineConfig (docs/config.md, "DeepSpeed's format: the mapping"). Settings the engine cannot honour
// are refused with the reason; keys accepted without effect are listed in EngineConfig::notes.
#include <string>

#include "zero/config/engine_config_types.h"
#include "zero/config/json_reading.h"

namespace zero::config_internal {

// The validated config of the parsed DeepSpeed file `root`; errors start with
// "<source_name> (deepspeed)". `strict`: keys without effect are refused instead of noted.
EngineConfig deepspeed_from(const json& root, const std::string& source_name, bool strict);

}  // namespace zero::config_internal
