#pragma once
// Runs `size` ranks as threads of this process, each with its own Gloo communicator over one
// in-memory store, for tests of the parts that need real collectives without launching processes.
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace zero::testing {

// Calls fn(comm) on every rank's thread and joins them. fn does its own checks (doctest assertions
// are thread-safe); an exception escaping fn terminates the test, so catch what you expect.
void run_thread_ranks(int size, const std::function<void(comm::Communicator&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));

// fn(comm) on every rank, its results by rank; what a rank throws is collected in `errors` (in the
// order the ranks threw) and leaves that rank's result default-constructed.
template <typename R>
std::vector<R> thread_rank_results(int size, const std::function<R(comm::Communicator&)>& fn,
                                   std::vector<std::string>& errors) {
  std::vector<R> out(static_cast<size_t>(size));
  std::mutex mu;
  run_thread_ranks(size, [&](comm::Communicator& comm) {
    try {
      R r = fn(comm);
      std::lock_guard<std::mutex> lock(mu);
      out[static_cast<size_t>(comm.rank())] = std::move(r);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
  });
  return out;
}

}  // namespace zero::testing
