#include "base/check.h"

namespace zero::detail {

void throw_check_failure(const char* file, int line, const char* condition,
                         const std::string& values, const std::string& message) {
  std::string what = fmt::format("check failed at {}:{}: {}", file, line, condition);
  if (!values.empty()) what += fmt::format(" ({})", values);
  if (!message.empty()) what += fmt::format(": {}", message);
  throw CheckError(what);
}

}  // namespace zero::detail
