#include "testing/thread_ranks.h"

#include <memory>
#include <thread>
#include <vector>

#include "comm/gloo/gloo_communicator.h"
#include "comm/store/memory_store.h"

namespace zero::testing {

void run_thread_ranks(int size, const std::function<void(comm::Communicator&)>& fn,
                      std::chrono::milliseconds timeout) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      comm::GlooOptions o;
      o.timeout = timeout;
      auto c = comm::make_gloo_communicator(store, r, size, o);
      fn(*c);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace zero::testing
