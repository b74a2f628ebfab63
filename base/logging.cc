#include "base/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>
#include <string>

#include "base/env.h"

namespace zero {
namespace {

std::string pattern_for(int rank) {
  if (rank < 0) return "[%H:%M:%S.%e] [zero] [%l] %v";
  return "[%H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%l] %v";
}

spdlog::level::level_enum level_from_env() {
  const std::string name = env_string("ZERO_LOG_LEVEL", "warn");
  const auto level = spdlog::level::from_str(name);
  // from_str answers "off" for unknown names; accept an explicit "off" only.
  if (level == spdlog::level::off && name != "off") return spdlog::level::warn;
  return level;
}

}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto l = std::make_shared<spdlog::logger>("zero", sink);
    l->set_pattern(pattern_for(-1));
    l->set_level(level_from_env());
    return l;
  }();
  return *instance;
}

void set_log_rank(int rank) { logger().set_pattern(pattern_for(rank)); }

}  // namespace zero
