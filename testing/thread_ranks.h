#pragma once
// Runs `size` ranks as threads of this process, each with its own Gloo communicator over one
// in-memory store, for tests of the parts that need real collectives without launching processes.
#include <chrono>
#include <functional>

#include "comm/communicator.h"

namespace zero::testing {

// Calls fn(comm) on every rank's thread and joins them. fn does its own checks (doctest assertions
// are thread-safe); an exception escaping fn terminates the test, so catch what you expect.
void run_thread_ranks(int size, const std::function<void(comm::Communicator&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace zero::testing
