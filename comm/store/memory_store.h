#pragma once
// A thread-safe in-process Store: the single-process rendezvous and the reference the other stores
// are tested against. Blocking calls wait on a condition variable until the key appears or the
// timeout passes (TimeoutError naming the key(s)).
#include <condition_variable>
#include <mutex>

#include "comm/store/store.h"
#include "comm/store/store_table.h"

namespace zero::comm {

class MemoryStore : public Store {
 public:
  MemoryStore();

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool delete_key(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  // Waits (lock held) until every key exists; throws TimeoutError naming `what` and the missing keys.
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout, const char* what);

  std::mutex mu_;
  std::condition_variable changed_;
  StoreTable table_;
};

}  // namespace zero::comm
