#pragma once
// Orders collectives against device streams, for either kind of communicator, so that the engine's
// parts say "after this stream's work" once and never branch on the backend.
//
//   host communicator (Gloo)   its collectives run on host threads the moment they are issued, so
//                              the buffers' producers must be complete: before_issue() blocks until
//                              the stream's work so far is done (nothing, on the host device's
//                              inline streams), and after() waits for the collective on the host.
//   CUDA communicator (NCCL)   before_issue() orders the next collective after the stream's work
//                              and after() makes the stream wait for the collective: no host wait.
#include <chrono>
#include <memory>

#include "comm/communicator.h"
#include "memory/device.h"

namespace zero {

class CollectiveOrder {
 public:
  // Throws InvalidArgument when `comm` does not accept the device's memory kind.
  CollectiveOrder(memory::Device& device, comm::Communicator& comm, std::chrono::milliseconds timeout);

  comm::Communicator& comm() { return comm_; }
  // Right before issuing a collective on buffers last written on `stream`.
  void before_issue(memory::Stream& stream);
  // `stream`'s later work runs after `work` completed.
  void after(comm::Work& work, memory::Stream& stream);

 private:
  memory::Device& device_;
  comm::Communicator& comm_;
  std::chrono::milliseconds timeout_;
  bool host_comm_;
  std::unique_ptr<memory::Event> event_;
};

}  // namespace zero
