#include "comm/gloo/gloo_store_adapter.h"

#include <algorithm>

#include "base/check.h"

namespace zero::comm {

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<comm::Store> store,
                                   std::chrono::milliseconds timeout)
    : store_(std::move(store)), timeout_(timeout) {
  if (!store_) ZERO_THROW(InvalidArgument, "GlooStoreAdapter: store is null");
  if (timeout_.count() <= 0) {
    ZERO_THROW(InvalidArgument, "GlooStoreAdapter: timeout must be positive, got {} ms",
               timeout_.count());
  }
}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  const Bytes b = store_->get(key, timeout_);
  return std::vector<char>(b.begin(), b.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { store_->wait(keys, timeout_); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  // Gloo passes its own default (30 s) here; never wait longer than our configured timeout.
  store_->wait(keys, std::min(timeout, timeout_));
}

}  // namespace zero::comm
