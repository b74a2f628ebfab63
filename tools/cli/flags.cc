#include "tools/cli/flags.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "base/check.h"

namespace zero::cli {

Flags::Flags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) ZERO_THROW(InvalidArgument, "unexpected argument '{}'", a);
    a = a.substr(2);
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      values_[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      values_[a] = argv[++i];
    } else {
      values_[a] = "true";
    }
  }
}

std::string Flags::get(const std::string& name, const std::string& fallback) {
  used_[name] = true;
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

int Flags::get_int(const std::string& name, int fallback) {
  const std::string v = get(name, std::to_string(fallback));
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') ZERO_THROW(InvalidArgument, "--{}: '{}' is not an integer", name, v);
  return static_cast<int>(x);
}

double Flags::get_double(const std::string& name, double fallback) {
  const std::string v = get(name, std::to_string(fallback));
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') ZERO_THROW(InvalidArgument, "--{}: '{}' is not a number", name, v);
  return x;
}

std::vector<std::string> Flags::get_list(const std::string& name, const std::string& fallback) {
  const std::string v = get(name, fallback);
  std::vector<std::string> items;
  size_t start = 0;
  for (;;) {
    const size_t comma = v.find(',', start);
    items.push_back(v.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (items.back().empty()) ZERO_THROW(InvalidArgument, "--{}: '{}' has an empty item", name, v);
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

std::vector<int> Flags::get_count_list(const std::string& name, const std::string& fallback) {
  std::vector<int> out;
  for (const std::string& s : get_list(name, fallback)) {
    char* end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (*end != '\0' || v < 0) ZERO_THROW(InvalidArgument, "--{}: '{}' is not a non-negative integer", name, s);
    out.push_back(static_cast<int>(v));
  }
  return out;
}

bool Flags::get_bool(const std::string& name, bool fallback) {
  const std::string v = get(name, fallback ? "true" : "false");
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  ZERO_THROW(InvalidArgument, "--{}: '{}' is not true/false", name, v);
}

bool Flags::has(const std::string& name) const { return values_.count(name) != 0; }

void Flags::check_all_used() const {
  for (const auto& [name, value] : values_) {
    if (!used_.count(name)) ZERO_THROW(InvalidArgument, "unknown flag --{}", name);
  }
}

}  // namespace zero::cli

namespace zero::cli {

int run_program(const char* program, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace zero::cli
