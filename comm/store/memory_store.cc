#include "comm/store/memory_store.h"

#include "base/check.h"

namespace zero::comm {

MemoryStore::MemoryStore() = default;

void MemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    table_.set(key, value);
  }
  changed_.notify_all();
}

Bytes MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, {key}, timeout, "get");
  return *table_.find(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t out = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = table_.add(key, delta);
  }
  changed_.notify_all();
  return out;
}

Bytes MemoryStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  Bytes out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = table_.compare_set(key, expected, desired);
  }
  changed_.notify_all();
  return out;
}

bool MemoryStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.erase(key);
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.contains_all(keys);
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, keys, timeout, "wait");
}

void MemoryStore::wait_locked(std::unique_lock<std::mutex>& lock,
                              const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout, const char* what) {
  const auto deadline = deadline_after(timeout);
  if (!changed_.wait_until(lock, deadline, [&] { return table_.contains_all(keys); })) {
    ZERO_THROW(TimeoutError, "memory store {}: timed out after {} ms waiting for key(s) {}", what,
               timeout.count(), format_keys(table_.missing(keys)));
  }
}

}  // namespace zero::comm
