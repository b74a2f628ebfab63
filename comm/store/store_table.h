#pragma once
// The key-value semantics every store shares (MemoryStore under its mutex, the TCP store server on its
// I/O thread), so that all stores answer alike:
//   - add() keeps the integer as decimal ASCII; a missing key counts as 0; a value that is not a
//     decimal int64 throws InvalidArgument naming the key; overflow throws InvalidArgument.
//   - compare_set() sets `desired` when the current value equals `expected`, where an absent key
//     matches only an empty `expected`; it returns the value after the call (empty for a key that is
//     still absent).
// Not thread-safe: the owner serializes access.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace zero::comm {

class StoreTable {
 public:
  void set(const std::string& key, Bytes value);
  // The stored value, or nullptr when the key is absent (valid until the next change).
  const Bytes* find(const std::string& key) const;
  int64_t add(const std::string& key, int64_t delta);
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired);
  bool erase(const std::string& key);
  bool contains(const std::string& key) const;
  bool contains_all(const std::vector<std::string>& keys) const;
  // The keys of `keys` that are absent, in order.
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  size_t size() const { return values_.size(); }

 private:
  std::map<std::string, Bytes> values_;
};

// now + timeout, with negative timeouts read as 0 and huge ones capped (30 days) so that the
// arithmetic cannot overflow.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds kCap = std::chrono::hours(24 * 30);
  const auto t = std::clamp(timeout, std::chrono::milliseconds(0), kCap);
  return std::chrono::steady_clock::now() + t;
}

// "'a'", "'a', 'b'": keys for error messages (long lists are shortened).
std::string format_keys(const std::vector<std::string>& keys);

}  // namespace zero::comm
