#pragma once
// Internal to zero/config: the strict reading of a config's JSON text and keys, shared by both
// formats. The text is refused with a repeated key; an object is read through an ObjectReader, which
// refuses the keys nobody asked for; a value is read by the read_* function of its type, which
// names the key and the type expected when it does not fit. Every error is InvalidArgument starting
// with the Context's source (the file and its format).
#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace zero::config_internal {

using json = nlohmann::json;

// What every error of one parse starts with: the file, and once known its format.
struct Context {
  std::string source;
  std::string keys_doc = "docs/config.md";  // where an unknown key's error sends the reader
  bool strict = false;  // ConfigReading::strict: keys without effect here are refused, not noted
};

[[noreturn]] void fail(const Context& ctx, const std::string& message);
// "<path> must be <expected>, got <the value>" (or the "auto" error, for HuggingFace's "auto").
[[noreturn]] void fail_type(const json& j, const std::string& path, const Context& ctx, std::string_view expected);

// One JSON object of the config. Every key the parser looks up (present or not) becomes known, so
// finish() can refuse the keys nobody asked for, suggesting the nearest known one.
class ObjectReader {
 public:
  ObjectReader(const json& j, std::string path, const Context& ctx);

  const json* find(const std::string& key);
  std::string path(std::string_view key) const;
  const Context& ctx() const { return ctx_; }

  void finish() const;

 private:
  const std::string* nearest(const std::string& key) const;

  const json& j_;
  std::string path_;
  const Context& ctx_;
  std::vector<std::string> known_;
};

// The value of `key`; "missing field <path>" when the object has none.
const json& require(ObjectReader& r, const std::string& key);

bool read_bool(const json& j, const std::string& path, const Context& ctx);
double read_number(const json& j, const std::string& path, const Context& ctx);
float read_float(const json& j, const std::string& path, const Context& ctx);
std::string read_string(const json& j, const std::string& path, const Context& ctx, std::string_view expected);
// An integer in [lo, hi]. A float that is a whole number (DeepSpeed configs write 5e8) counts.
int64_t read_integer(const json& j, const std::string& path, const Context& ctx, int64_t lo, int64_t hi);
int read_int(const json& j, const std::string& path, const Context& ctx, int lo = INT_MIN, int hi = INT_MAX);

// A name parsed by one of the library's parse_* functions, whose error gets the key in front.
template <typename Parse>
auto read_name(const json& j, const std::string& path, const Context& ctx, std::string_view expected, Parse parse) {
  const std::string name = read_string(j, path, ctx, expected);
  try {
    return parse(name);
  } catch (const InvalidArgument& e) {
    fail(ctx, fmt::format("{}: {}", path, e.what()));
  }
}

// A JSON file's whole text; IoError "cannot open <what> '<path>': <reason>" when it cannot be
// opened, "cannot read ..." when it cannot be read or is a directory.
std::string read_text_file(const std::string& path, std::string_view what);

// The parsed text; malformed JSON and a key repeated in one object are errors naming `source`.
json parse_json(std::string_view text, const std::string& source);

}  // namespace zero::config_internal
