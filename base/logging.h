#pragma once
// Library logging through spdlog. Every line carries the rank once it is known:
//   [12:00:01.123] [rank 1] [warn] message
// The level comes from ZERO_LOG_LEVEL (trace, debug, info, warn, error, critical, off; default warn).
#include <spdlog/spdlog.h>

namespace zero {

// The library's logger (created on first use, thread-safe).
spdlog::logger& logger();

// Sets the rank shown in every later line; -1 shows none.
void set_log_rank(int rank);

}  // namespace zero

#define ZERO_LOG_TRACE(...) ::zero::logger().trace(__VA_ARGS__)
#define ZERO_LOG_DEBUG(...) ::zero::logger().debug(__VA_ARGS__)
#define ZERO_LOG_INFO(...) ::zero::logger().info(__VA_ARGS__)
#define ZERO_LOG_WARN(...) ::zero::logger().warn(__VA_ARGS__)
#define ZERO_LOG_ERROR(...) ::zero::logger().error(__VA_ARGS__)
