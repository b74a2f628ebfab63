#include "zero/collective_order.h"

#include "base/check.h"

namespace zero {

CollectiveOrder::CollectiveOrder(memory::Device& device, comm::Communicator& comm,
                                 std::chrono::milliseconds timeout)
    : device_(device), comm_(comm), timeout_(timeout), host_comm_(device.kind() != memory::DeviceKind::kCuda),
      event_(device.create_event()) {
  if (!comm.accepts(device.kind())) {
    ZERO_THROW(InvalidArgument,
               "communicator '{}' (rank {} of {}) does not accept {} memory, where the engine's device '{}' "
               "keeps its buffers: use a {} communicator",
               comm.backend_name(), comm.rank(), comm.size(), memory::Location{device.kind(), 0}.name(),
               device.name(), host_comm_ ? "host (Gloo)" : "CUDA (NCCL)");
  }
}

void CollectiveOrder::before_issue(memory::Stream& stream) {
  if (host_comm_) {
    device_.record(*event_, stream);
    device_.synchronize(*event_, timeout_);
  } else {
    comm_.set_issue_stream(device_.native_handle(stream));
  }
}

void CollectiveOrder::after(comm::Work& work, memory::Stream& stream) {
  if (host_comm_) {
    work.wait(timeout_);
  } else {
    work.wait_stream(device_.native_handle(stream));
  }
}

}  // namespace zero
