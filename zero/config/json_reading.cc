#include "zero/config/json_reading.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <utility>

#include "base/check.h"

namespace zero::config_internal {
namespace {

std::string join_path(std::string_view parent, std::string_view key) {
  return parent.empty() ? std::string(key) : fmt::format("{}.{}", parent, key);
}

// A value as the user wrote it, for error messages ("\"12\" (a string)"). Arrays and objects are
// only named: printing them would be as deep and as long as the input.
std::string describe(const json& j) {
  switch (j.type()) {
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::string: {
      std::string text = j.dump();
      if (text.size() > 40) text = text.substr(0, 36) + "...\"";
      return text + " (a string)";
    }
    default: return j.dump();
  }
}

// HuggingFace's Trainer replaces "auto" with values it computes; read without it, they mean nothing.
void check_not_auto(const json& j, const std::string& path, const Context& ctx) {
  if (j.is_string() && j.get_ref<const std::string&>() == "auto") {
    fail(ctx, fmt::format("{} is \"auto\": \"auto\" values are filled in by HuggingFace's Trainer and must be "
                          "resolved to a value before the engine reads the config",
                          path));
  }
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 0; i < a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i + 1;
    for (size_t j = 0; j < b.size(); ++j) {
      const size_t up = row[j + 1];
      row[j + 1] = std::min({up + 1, row[j] + 1, diagonal + (a[i] == b[j] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

void fail(const Context& ctx, const std::string& message) {
  ZERO_THROW(InvalidArgument, "{}: {}", ctx.source, message);
}

void fail_type(const json& j, const std::string& path, const Context& ctx, std::string_view expected) {
  check_not_auto(j, path, ctx);
  fail(ctx, fmt::format("{} must be {}, got {}", path, expected, describe(j)));
}

// ---------------------------------------------------------------------------------------------
// Objects

ObjectReader::ObjectReader(const json& j, std::string path, const Context& ctx)
    : j_(j), path_(std::move(path)), ctx_(ctx) {
  if (!j.is_object()) fail_type(j, path_.empty() ? "the top level" : path_, ctx, "an object");
}

const json* ObjectReader::find(const std::string& key) {
  known_.push_back(key);
  const auto it = j_.find(key);
  return it == j_.end() ? nullptr : &*it;
}

std::string ObjectReader::path(std::string_view key) const { return join_path(path_, key); }

void ObjectReader::finish() const {
  for (const auto& item : j_.items()) {
    if (std::find(known_.begin(), known_.end(), item.key()) != known_.end()) continue;
    std::string message = fmt::format("unknown key {}", path(item.key()));
    if (const std::string* near = nearest(item.key())) message += fmt::format(" (did you mean {}?)", path(*near));
    fail(ctx_, fmt::format("{}; {} lists the keys", message, ctx_.keys_doc));
  }
}

const std::string* ObjectReader::nearest(const std::string& key) const {
  const std::string* best = nullptr;
  size_t best_distance = SIZE_MAX;
  for (const std::string& k : known_) {
    const size_t d = edit_distance(key, k);
    if (d < best_distance) best = &k, best_distance = d;
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
// Values

bool read_bool(const json& j, const std::string& path, const Context& ctx) {
  if (!j.is_boolean()) fail_type(j, path, ctx, "true or false");
  return j.get<bool>();
}

double read_number(const json& j, const std::string& path, const Context& ctx) {
  if (!j.is_number()) fail_type(j, path, ctx, "a number");
  return j.get<double>();
}

float read_float(const json& j, const std::string& path, const Context& ctx) {
  const double d = read_number(j, path, ctx);
  const float f = static_cast<float>(d);
  if (!std::isfinite(f)) fail(ctx, fmt::format("{} = {} is outside the range of a 32-bit float", path, d));
  return f;
}

std::string read_string(const json& j, const std::string& path, const Context& ctx, std::string_view expected) {
  if (!j.is_string()) fail_type(j, path, ctx, expected);
  check_not_auto(j, path, ctx);
  return j.get<std::string>();
}

int64_t read_integer(const json& j, const std::string& path, const Context& ctx, int64_t lo, int64_t hi) {
  const char* expected = lo == 0 ? "a non-negative integer" : lo == 1 ? "a positive integer" : "an integer";
  auto below = [&] {
    if (lo == 0 || lo == 1) fail_type(j, path, ctx, expected);
    fail(ctx, fmt::format("{} must be at least {}, got {}", path, lo, j.dump()));
  };
  auto above = [&] { fail(ctx, fmt::format("{} must be at most {}, got {}", path, hi, j.dump())); };
  if (!j.is_number()) fail_type(j, path, ctx, expected);
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (d != std::floor(d)) fail_type(j, path, ctx, expected);  // a fraction
    if (d < static_cast<double>(lo)) below();
    if (d > static_cast<double>(hi) || d >= 0x1p63) above();
    return static_cast<int64_t>(d);
  }
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) above();
    if (static_cast<int64_t>(u) < lo) below();
    return static_cast<int64_t>(u);
  }
  const int64_t v = j.get<int64_t>();
  if (v < lo) below();
  if (v > hi) above();
  return v;
}

int read_int(const json& j, const std::string& path, const Context& ctx, int lo, int hi) {
  return static_cast<int>(read_integer(j, path, ctx, lo, hi));
}

// ---------------------------------------------------------------------------------------------
// JSON text

// The parser keeps the last of two equal keys; a config must not lose one silently, so the
// callback tracks the keys of every open object and refuses a repeat.
json parse_json(std::string_view text, const std::string& source) {
  struct Frame {
    bool object = false;
    std::set<std::string> keys;
  };
  std::vector<Frame> open;
  const Context ctx{source};
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open.push_back({true, {}}); break;
      case json::parse_event_t::array_start: open.push_back({false, {}}); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end: open.pop_back(); break;
      case json::parse_event_t::key:
        if (!open.back().keys.insert(parsed.get<std::string>()).second) {
          fail(ctx, fmt::format("key \"{}\" appears twice in one object", parsed.get<std::string>()));
        }
        break;
      case json::parse_event_t::value: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::parse_error& e) {
    fail(ctx, fmt::format("malformed JSON: {}", e.what()));
  } catch (const json::exception& e) {
    // E.g. a number beyond a double's range (1e999): the parser's out_of_range, not a parse_error.
    fail(ctx, fmt::format("unreadable JSON: {}", e.what()));
  }
}

const json& require(ObjectReader& r, const std::string& key) {
  const json* j = r.find(key);
  if (j == nullptr) fail(r.ctx(), fmt::format("missing field {}", r.path(key)));
  return *j;
}

std::string read_text_file(const std::string& path, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) ZERO_THROW(IoError, "cannot read {} '{}': a directory", what, path);
  std::ifstream in(path, std::ios::binary);
  if (!in) ZERO_THROW(IoError, "cannot open {} '{}': {}", what, path, std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) ZERO_THROW(IoError, "cannot read {} '{}': {}", what, path, std::strerror(errno));
  return text;
}

}  // namespace zero::config_internal
