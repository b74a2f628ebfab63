#pragma once
// Internal to zero/config: the checks every config read passes before it is returned, whichever
// format it came in (zero::validate, the optimizer's and the loss scaler's own checks, the layout,
// the model dtype and the loop).
#include <string>
#include <utility>
#include <vector>

#include "zero/config/engine_config_types.h"
#include "zero/config/json_reading.h"

namespace zero::config_internal {

// (text an error names, the DeepSpeed key that set it): appended to a validation error, so that it
// names the key in the file as well as the option.
using Origins = std::vector<std::pair<std::string, std::string>>;

// Copies the engine's stage, offload and micro-batches into c.layout, then checks: InvalidArgument
// starting with ctx.source, naming the option out of range (and the key in `origins` that set it, if
// any).
void validate_config(EngineConfig& c, const Context& ctx, const Origins& origins = {});

}  // namespace zero::config_internal
