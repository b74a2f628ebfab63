#pragma once
// Rendezvous key-value store (docs/design.md, "Store"). Bootstraps Gloo and NCCL and carries small control
// messages (registration checks, schedule checks). Every blocking call takes a timeout and throws
// zero::TimeoutError naming the key(s) it waited for; a broken connection throws zero::CommError.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zero::comm {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits until the key exists, then returns its value.
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Adds delta to the integer stored at key (0 when absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to desired if its current value equals expected (an absent key matches an empty
  // expected value); returns the value after the call.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // Removes key; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;
  // True when every key exists (does not wait).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;

  // Convenience for string values.
  void set_string(const std::string& key, const std::string& value) {
    set(key, Bytes(value.begin(), value.end()));
  }
  std::string get_string(const std::string& key, std::chrono::milliseconds timeout) {
    const Bytes b = get(key, timeout);
    return std::string(b.begin(), b.end());
  }
};

}  // namespace zero::comm
