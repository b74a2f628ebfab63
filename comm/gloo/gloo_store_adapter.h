#pragma once
// Presents a zero::comm::Store as gloo::rendezvous::Store so Gloo's connectFullMesh can exchange
// addresses through our rendezvous (TCP store, memory store, prefix store). Gloo's get() blocks until
// the key exists; the adapter waits at most `timeout` and lets our TimeoutError (naming the key)
// propagate, so a missing peer never hangs the rendezvous.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "comm/store/store.h"

namespace zero::comm {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<comm::Store> store, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<comm::Store> store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace zero::comm
