#pragma once
// Environment knobs. Each reader names the variable in its error when the value cannot be parsed.
#include <cstdint>
#include <optional>
#include <string>

namespace zero {

// The variable's value, or nullopt when unset (an empty value counts as set).
std::optional<std::string> env_get(const char* name);

std::string env_string(const char* name, const std::string& fallback);

// Parses a base-10 integer; throws InvalidArgument naming the variable on garbage or overflow.
int64_t env_int(const char* name, int64_t fallback);

// Accepts 1/0, true/false, yes/no, on/off (any case); throws InvalidArgument otherwise.
bool env_bool(const char* name, bool fallback);

}  // namespace zero
