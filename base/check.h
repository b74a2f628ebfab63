#pragma once
// Check macros for programming errors. Each throws zero::CheckError with the file, line, the condition
// as written and, for comparisons, both operand values; an optional fmt-style message follows.
//
//   ZERO_CHECK(ptr != nullptr, "buffer {} not allocated", name);
//   ZERO_CHECK_EQ(a.size(), b.size(), "length of '{}'", name);
//
// Recoverable faults (bad user input, timeouts) should throw the typed errors of base/error.h with
// ZERO_THROW instead.
#include <fmt/format.h>

#include <sstream>
#include <string>
#include <type_traits>

#include "base/error.h"

namespace zero::detail {

template <typename T>
std::string check_value_string(const T& v) {
  if constexpr (std::is_enum_v<T>) {
    return std::to_string(static_cast<long long>(v));
  } else if constexpr (std::is_pointer_v<T>) {
    return fmt::format("{}", static_cast<const void*>(v));
  } else if constexpr (fmt::is_formattable<T>::value) {
    return fmt::format("{}", v);
  } else {
    std::ostringstream os;
    os << v;
    return os.str();
  }
}

[[noreturn]] void throw_check_failure(const char* file, int line, const char* condition,
                                      const std::string& values, const std::string& message);

inline std::string check_message() { return {}; }
template <typename... Args>
std::string check_message(fmt::format_string<Args...> f, Args&&... args) {
  return fmt::format(f, std::forward<Args>(args)...);
}

}  // namespace zero::detail

#define ZERO_CHECK(cond, ...)                                                               \
  do {                                                                                      \
    if (!(cond)) [[unlikely]] {                                                             \
      ::zero::detail::throw_check_failure(__FILE__, __LINE__, #cond, std::string(),         \
                                          ::zero::detail::check_message(__VA_ARGS__));      \
    }                                                                                       \
  } while (0)

#define ZERO_CHECK_OP_(a, b, op, ...)                                                       \
  do {                                                                                      \
    const auto& zero_check_a_ = (a);                                                        \
    const auto& zero_check_b_ = (b);                                                        \
    if (!(zero_check_a_ op zero_check_b_)) [[unlikely]] {                                   \
      ::zero::detail::throw_check_failure(                                                  \
          __FILE__, __LINE__, #a " " #op " " #b,                                            \
          ::zero::detail::check_value_string(zero_check_a_) + " vs " +                      \
              ::zero::detail::check_value_string(zero_check_b_),                            \
          ::zero::detail::check_message(__VA_ARGS__));                                      \
    }                                                                                       \
  } while (0)

#define ZERO_CHECK_EQ(a, b, ...) ZERO_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define ZERO_CHECK_NE(a, b, ...) ZERO_CHECK_OP_(a, b, !=, __VA_ARGS__)
#define ZERO_CHECK_LT(a, b, ...) ZERO_CHECK_OP_(a, b, <, __VA_ARGS__)
#define ZERO_CHECK_LE(a, b, ...) ZERO_CHECK_OP_(a, b, <=, __VA_ARGS__)
#define ZERO_CHECK_GT(a, b, ...) ZERO_CHECK_OP_(a, b, >, __VA_ARGS__)
#define ZERO_CHECK_GE(a, b, ...) ZERO_CHECK_OP_(a, b, >=, __VA_ARGS__)

// Throws a typed error (from base/error.h) with a formatted message.
#define ZERO_THROW(ErrorType, ...) throw ErrorType(fmt::format(__VA_ARGS__))
