#pragma once
// Internal to zero/config: our own format (docs/config.md, "Our format: every key"), the fields of
// EngineConfig nested as in the structs. One description of the fields is walked by the reader, the
// writer and the key lister, so the three cannot disagree.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zero/config/engine_config_types.h"
#include "zero/config/json_reading.h"

namespace zero::config_internal {

// Sets the fields of `c` that the top-level object `root` gives (the rest keep their values);
// refuses unknown keys and values of the wrong type. The result is not validated.
void read_native(const json& root, const Context& ctx, EngineConfig& c);

// Every field of `c` (an unset optional is left out), in document order.
nlohmann::ordered_json write_native(const EngineConfig& c);

// Every key path the format accepts, in document order ("optimizer.groups[].lr").
std::vector<std::string> native_keys();

}  // namespace zero::config_internal
