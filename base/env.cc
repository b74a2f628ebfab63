#include "base/env.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "base/check.h"

namespace zero {

std::optional<std::string> env_get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string env_string(const char* name, const std::string& fallback) {
  return env_get(name).value_or(fallback);
}

int64_t env_int(const char* name, int64_t fallback) {
  const auto v = env_get(name);
  if (!v || v->empty()) return fallback;
  int64_t out = 0;
  const char* end = v->data() + v->size();
  const auto [ptr, ec] = std::from_chars(v->data(), end, out);
  if (ec != std::errc() || ptr != end) {
    ZERO_THROW(InvalidArgument, "environment variable {}='{}' is not an integer", name, *v);
  }
  return out;
}

bool env_bool(const char* name, bool fallback) {
  auto v = env_get(name);
  if (!v || v->empty()) return fallback;
  std::string s = *v;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  ZERO_THROW(InvalidArgument, "environment variable {}='{}' is not a boolean (use 1/0, true/false)",
             name, *v);
}

}  // namespace zero
