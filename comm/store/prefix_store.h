#pragma once
// A view of another store with every key namespaced as prefix + "/" + key, so that independent users
// of one rendezvous (two process groups, a schedule check) cannot collide. Prefix stores nest:
// PrefixStore("b", PrefixStore("a", s)) writes "a/b/key".
#include <memory>

#include "comm/store/store.h"

namespace zero::comm {

class PrefixStore : public Store {
 public:
  // Throws InvalidArgument for an empty prefix or a null inner store.
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  const std::string& prefix() const { return prefix_; }

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool delete_key(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace zero::comm
