#pragma once
// Collective communication (docs/design.md, "Communicator").
//
// Buffers are raw pointers with an element count and a dtype; the backend decides where they must
// live (Gloo: host memory; NCCL: CUDA device memory). Every call is asynchronous and returns a Work
// handle; collectives issued on one communicator complete in issue order. Every blocking wait has a
// timeout, and a failure (TimeoutError, CommError) names the operation, its sequence number and the
// rank.
//
// Point-to-point (send/recv): the k-th send from rank a to rank b matches the k-th recv on b from a
// (MPI's non-overtaking rule, per pair and direction); the count and dtype must agree. They have a
// sequence of their own per (peer, direction), so ranks not involved are not affected, and they do
// not wait behind queued collectives. Errors follow the collectives' rules and name the peer
// (docs/comm.md, "Point-to-point").
//
// Layout rules (NCCL's, so that sharded engines can work in place):
//   reduce_scatter: send holds size() * recv_count elements; rank r receives the reduction of chunk r.
//                   In place when recv == send + rank() * recv_count.
//   all_gather:     recv holds size() * send_count elements; chunk r comes from rank r.
//                   In place when send == recv + rank() * send_count.
//   all_to_all:     send and recv hold size() * count elements; recv chunk r is send chunk rank()
//                   of rank r. Not in place.
// fp16 and bf16 sums accumulate in fp32 on the Gloo backend.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "base/dtype.h"
#include "memory/tracker.h"

namespace zero::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* reduce_op_name(ReduceOp op);
// Accepts the names reduce_op_name prints ("sum", "avg", "max", "min"); InvalidArgument otherwise.
ReduceOp parse_reduce_op(std::string_view name);

// Handle to one issued collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective completed; throws TimeoutError past the timeout and CommError when
  // it failed. Waiting again after success returns at once.
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  // Waits with the communicator's default timeout.
  virtual void wait() = 0;
  // Non-blocking completion test (throws if it failed).
  virtual bool is_completed() = 0;
  // CUDA backends: makes `stream` (a cudaStream_t) wait for the collective without blocking the
  // host. Host backends wait on the host.
  virtual void wait_stream(void* stream) {
    (void)stream;
    wait();
  }
};
using WorkHandle = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;
  virtual std::chrono::milliseconds default_timeout() const = 0;

  // Whether buffers of this memory kind may be passed to the collectives: host backends (Gloo)
  // take host and pinned host memory, CUDA backends (NCCL) device memory. The engine checks its
  // device against this at construction.
  virtual bool accepts(memory::DeviceKind kind) const { return kind != memory::DeviceKind::kCuda; }
  // CUDA backends: collectives this thread issues from now on run after the work issued so far to
  // `stream` (a cudaStream_t). Host backends ignore it: their callers complete a buffer's producers
  // before issuing.
  virtual void set_issue_stream(void* stream) { (void)stream; }
  // Names what the calls issued next on this communicator are for (e.g. "unit 3 forward"; "" for
  // none), until the next set_call_label. With the schedule check on, the label is part of what the
  // ranks must agree on: calls of the same shape issued for different purposes fail with the
  // schedule mismatch, which names each rank's label (comm/schedule_check.h). Labels longer than
  // 32 bytes are cut. Backends without a schedule check ignore it. CallLabel sets one for a scope.
  virtual void set_call_label(std::string_view label) { (void)label; }
  // Where the caller already waits (the engine: the step's end): compares the calls every rank
  // issued on this communicator since the last verification, and throws CommError naming the first
  // that differs. Backends that check each call as it is issued (Gloo) have nothing to do; NCCL
  // defers its check to here (comm/schedule_ledger.h). Every rank must call it at the same point.
  virtual void verify_schedule() {}

  virtual WorkHandle all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  virtual WorkHandle reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                    ReduceOp op) = 0;
  virtual WorkHandle all_gather(const void* send, void* recv, size_t send_count, DType dtype) = 0;
  virtual WorkHandle broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  virtual WorkHandle all_to_all(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual WorkHandle barrier() = 0;

  // Point-to-point: sends `count` elements of buf to rank `peer` / receives them from `peer` into
  // buf. Asynchronous: the buffer must stay untouched (send) or unread (recv) until the Work
  // completes. Arguments are checked on the caller's thread (InvalidArgument naming the argument:
  // peer out of range or this rank, buf null with count > 0, a size that overflows). Backends that
  // cannot move data between two ranks alone keep this default, which throws InvalidArgument "send
  // is not supported by the <backend> communicator".
  virtual WorkHandle send(const void* buf, size_t count, DType dtype, int peer);
  virtual WorkHandle recv(void* buf, size_t count, DType dtype, int peer);

  // A communicator over the ranks that pass the same color, ordered by (key, rank). Collective:
  // every rank must call it. Ranks passing a negative color get nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// The checks every backend's send/recv make on the caller's thread (Communicator::send): throws
// InvalidArgument naming `op` and the argument; returns the transfer's size in bytes.
size_t check_p2p_args(const char* op, const void* buf, size_t count, DType dtype, int peer,
                      int rank, int size);

// Labels the calls issued on `comm` while it lives (Communicator::set_call_label), then clears the
// label.
class CallLabel {
 public:
  CallLabel(Communicator& comm, std::string_view label) : comm_(comm) { comm_.set_call_label(label); }
  ~CallLabel() { comm_.set_call_label({}); }
  CallLabel(const CallLabel&) = delete;
  CallLabel& operator=(const CallLabel&) = delete;

 private:
  Communicator& comm_;
};

}  // namespace zero::comm
