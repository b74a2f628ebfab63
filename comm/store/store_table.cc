#include "comm/store/store_table.h"

#include <charconv>
#include <limits>

#include "base/check.h"

namespace zero::comm {

void StoreTable::set(const std::string& key, Bytes value) { values_[key] = std::move(value); }

const Bytes* StoreTable::find(const std::string& key) const {
  const auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

int64_t StoreTable::add(const std::string& key, int64_t delta) {
  int64_t current = 0;
  if (const Bytes* v = find(key)) {
    const char* begin = reinterpret_cast<const char*>(v->data());
    const char* end = begin + v->size();
    const auto [ptr, ec] = std::from_chars(begin, end, current);
    if (v->empty() || ec != std::errc() || ptr != end) {
      ZERO_THROW(InvalidArgument, "store add('{}'): the stored value '{}' is not an integer", key,
                 std::string(begin, std::min<size_t>(v->size(), 64)));
    }
  }
  int64_t next = 0;
  if (__builtin_add_overflow(current, delta, &next)) {
    ZERO_THROW(InvalidArgument, "store add('{}'): {} + {} overflows int64", key, current, delta);
  }
  const std::string text = std::to_string(next);
  values_[key] = Bytes(text.begin(), text.end());
  return next;
}

Bytes StoreTable::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const auto it = values_.find(key);
  if (it == values_.end()) {
    if (!expected.empty()) return {};
    values_.emplace(key, desired);
    return desired;
  }
  if (it->second == expected) it->second = desired;
  return it->second;
}

bool StoreTable::erase(const std::string& key) { return values_.erase(key) > 0; }

bool StoreTable::contains(const std::string& key) const { return values_.count(key) > 0; }

bool StoreTable::contains_all(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (!contains(k)) return false;
  }
  return true;
}

std::vector<std::string> StoreTable::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys) {
    if (!contains(k)) out.push_back(k);
  }
  return out;
}

std::string format_keys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 8;
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) {
    if (i > 0) out += ", ";
    out += "'" + keys[i] + "'";
  }
  if (keys.size() > kShown) out += fmt::format(" and {} more", keys.size() - kShown);
  return out;
}

}  // namespace zero::comm
