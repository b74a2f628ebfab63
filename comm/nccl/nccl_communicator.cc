#include "comm/nccl/nccl_communicator.h"

#include "base/check.h"

namespace zero::comm {

// The same checks in CPU and CUDA builds.
void NcclOptions::validate() const {
  if (device < -1) ZERO_THROW(InvalidArgument, "NcclOptions.device must be >= -1, got {}", device);
  if (timeout.count() <= 0) {
    ZERO_THROW(InvalidArgument, "NcclOptions.timeout must be positive, got {} ms", timeout.count());
  }
  if (prefix.empty()) ZERO_THROW(InvalidArgument, "NcclOptions.prefix must not be empty");
}

}  // namespace zero::comm

#ifdef ZERO_WITH_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "base/logging.h"
#include "comm/p2p_stall_check.h"
#include "comm/schedule_check.h"
#include "comm/schedule_ledger.h"

namespace zero::comm {

bool nccl_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: clear the sticky error
    return 0;
  }
  return n;
}

bool nccl_available() { return cuda_device_count() > 0; }

namespace {

using Clock = std::chrono::steady_clock;
// How long a transfer waits before the p2p stall check publishes it.
constexpr std::chrono::milliseconds kStallDelay(250);

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
  }
  ZERO_THROW(InvalidArgument, "unknown dtype value {}", static_cast<int>(t));
}

ncclRedOp_t nccl_op(const char* name, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  ZERO_THROW(InvalidArgument, "{}: unknown reduce op value {}", name, static_cast<int>(op));
}

void cuda_ok(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    ZERO_THROW(CommError, "{}: CUDA error {}: {}", what, cudaGetErrorName(e),
               cudaGetErrorString(e));
  }
}

// Makes `device` current for a scope and restores the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (device >= 0 && device != previous_) cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  if (an == 0 || bn == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

void require_buffer(const char* op, const char* name, const void* p, size_t count) {
  if (p == nullptr && count > 0) {
    ZERO_THROW(InvalidArgument, "{}: {} is null with count {}", op, name, count);
  }
}

// One group of point-to-point transfers, launched together (ncclGroupStart/End) so that a rank
// that sends and receives at once cannot deadlock on its own stream; shared by their Works.
struct NcclP2PGroup {
  std::mutex mu;
  bool launched = false;
  cudaEvent_t done = nullptr;  // recorded on the NCCL stream after the group
  std::string failure;         // why the group was not launched
  ~NcclP2PGroup() {
    if (done) cudaEventDestroy(done);
  }
};

// The NCCL communicator and its failure state, shared with the work handles (which may outlive
// the communicator object).
struct NcclShared {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int device = 0;
  std::chrono::milliseconds timeout{0};
  std::mutex mu;
  std::string failure;  // non-empty once failed
  bool aborted = false;

  // The p2p stall check (comm/p2p_stall_check.h; null without the check): the transfers launched
  // and not known complete, looked at by whichever thread waits for one of them.
  struct LaunchedP2P {
    CallInfo call;
    Clock::time_point posted;
    std::shared_ptr<NcclP2PGroup> group;
  };
  std::mutex stall_mu;
  std::vector<LaunchedP2P> launched;
  std::unique_ptr<P2PStallCheck> stall_check;
  Clock::time_point next_look{};

  // The deferred schedule check (null with the check off or per call): the calls issued, and where
  // the ranks compare them when a wait times out.
  struct Deferred {
    std::mutex mu;
    ScheduleLedger ledger;
    std::shared_ptr<Store> store;
    std::string prefix;  // the store keys' prefix for this communicator
    int size = 0;
    uint64_t verified = 0;  // verifications that agreed: the watchdog's key, equal on every rank
  };
  std::unique_ptr<Deferred> deferred;

  // The watchdog: a wait timed out (a schedule mismatch usually hangs before anything else notices
  // it), so every rank that times out publishes its recent calls and compares the others'. The
  // mismatch's message, or "" (no check, or the calls agree: the hang is something else).
  std::string diagnose_timeout() {
    if (!deferred) return {};
    std::lock_guard<std::mutex> lock(deferred->mu);
    const std::chrono::milliseconds wait = std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(10));
    try {
      return compare_through_store(*deferred->store, fmt::format("{}/watchdog/{}", deferred->prefix, deferred->verified),
                                   rank, deferred->size, deferred->ledger, wait);
    } catch (const Error& e) {
      return fmt::format("(the calls could not be compared: {})", e.what());
    }
  }

  // One look when one is due: a transfer whose partner disagrees fails (and aborts) the
  // communicator; its message, else "".
  std::string look_at_stalls() {
    std::lock_guard<std::mutex> lock(stall_mu);
    const auto now = Clock::now();
    if (!stall_check || now < next_look) return {};
    std::erase_if(launched, [](const LaunchedP2P& t) {
      std::lock_guard<std::mutex> group_lock(t.group->mu);
      return t.group->done != nullptr && cudaEventQuery(t.group->done) == cudaSuccess;
    });
    std::vector<P2PStallCheck::Pending> pending;
    for (const LaunchedP2P& t : launched) pending.push_back({t.call, t.posted});
    const auto verdict = stall_check->look(pending, now);
    next_look = now + stall_check->next_look();
    if (!verdict) return {};
    const std::string msg = fmt::format("nccl rank {}: {}: {}", rank,
                                        describe_call(launched[verdict->index].call), verdict->mismatch);
    fail_and_abort(msg);
    return msg;
  }

  std::string failed_reason() {
    std::lock_guard<std::mutex> lock(mu);
    return failure;
  }
  // Marks the communicator failed (first reason wins) and aborts it so that nothing blocks on it.
  void fail_and_abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    if (failure.empty()) failure = reason;
    if (!aborted && comm != nullptr) {
      ncclCommAbort(comm);
      aborted = true;
    }
  }
  // ncclSuccess, or an error string when the communicator reports an asynchronous error.
  std::string async_error() {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) return "communicator aborted";
    ncclResult_t r = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) return ncclGetErrorString(q);
    if (r != ncclSuccess && r != ncclInProgress) {
      return fmt::format("{} ({})", ncclGetErrorString(r), ncclGetLastError(comm));
    }
    return {};
  }
  // Non-blocking communicators may answer ncclInProgress: poll until the call settled.
  void settle(ncclResult_t r, const std::string& what) {
    const auto deadline = Clock::now() + timeout;
    while (r == ncclInProgress) {
      if (Clock::now() > deadline) {
        fail_and_abort(what + ": NCCL call still in progress at the timeout");
        ZERO_THROW(TimeoutError, "{}: NCCL call did not settle within {} ms", what,
                   timeout.count());
      }
      std::this_thread::yield();
      ncclCommGetAsyncError(comm, &r);
    }
    if (r != ncclSuccess) {
      const std::string msg =
          fmt::format("{}: NCCL error {} ({})", what, ncclGetErrorString(r), ncclGetLastError(comm));
      fail_and_abort(msg);
      throw CommError(msg);
    }
  }
  // Whether `event` completed, without blocking. An error found on the way (the event's, or the
  // communicator's asynchronous one) fails the communicator and throws CommError naming `what`.
  bool event_done(cudaEvent_t event, const std::string& what) {
    const cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) return true;
    const std::string err = q == cudaErrorNotReady ? async_error() : std::string(cudaGetErrorString(q));
    if (!err.empty()) {
      const std::string msg = fmt::format("{} failed: {}", what, err);
      fail_and_abort(msg);
      throw CommError(msg);
    }
    return false;
  }
  // Waits for `event` (polling the communicator's async error) until `timeout`; aborts on timeout.
  // `p2p`: the event ends transfers, so the wait runs the stall check meanwhile.
  void wait_event(cudaEvent_t event, std::chrono::milliseconds wait_timeout,
                  const std::string& what, bool p2p = false) {
    const auto deadline = Clock::now() + wait_timeout;
    for (;;) {
      if (p2p) {
        const std::string mismatch = look_at_stalls();
        if (!mismatch.empty()) {
          // The same message on both ranks when it is this transfer's partner that disagrees.
          throw CommError(mismatch.rfind(what, 0) == 0 ? mismatch
                                                       : fmt::format("{} failed: {}", what, mismatch));
        }
      }
      const cudaError_t q = cudaEventQuery(event);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        const std::string msg = fmt::format("{} failed: CUDA error {}", what, cudaGetErrorString(q));
        fail_and_abort(msg);
        throw CommError(msg);
      }
      const std::string err = async_error();
      if (!err.empty()) {
        const std::string msg = fmt::format("{} failed: NCCL {}", what, err);
        fail_and_abort(msg);
        throw CommError(msg);
      }
      if (Clock::now() > deadline) {
        const std::string mismatch = diagnose_timeout();
        const std::string msg = fmt::format("{} did not complete within {} ms (communicator aborted){}", what,
                                            wait_timeout.count(), mismatch.empty() ? "" : ": " + mismatch);
        fail_and_abort(msg);
        throw TimeoutError(msg);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclShared> shared, cudaEvent_t done, std::string what)
      : shared_(std::move(shared)), done_(done), what_(std::move(what)) {}
  ~NcclWork() override { cudaEventDestroy(done_); }

  void wait(std::chrono::milliseconds timeout) override {
    if (completed_) return;
    shared_->wait_event(done_, timeout, what_);
    completed_ = true;
  }
  void wait() override { wait(shared_->timeout); }
  bool is_completed() override {
    if (!completed_) completed_ = shared_->event_done(done_, what_);
    return completed_;
  }
  void wait_stream(void* stream) override {
    const std::string failure = shared_->failed_reason();
    if (!failure.empty()) ZERO_THROW(CommError, "{}: communicator failed: {}", what_, failure);
    cuda_ok(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_, 0), what_);
  }

 private:
  std::shared_ptr<NcclShared> shared_;
  cudaEvent_t done_;
  std::string what_;
  bool completed_ = false;
};

// Lets a transfer's Work launch the pending group; cleared (under mu) by the communicator's
// destructor, since Works may outlive it.
struct NcclFlushLink {
  std::mutex mu;
  std::function<void()> flush;
};

class NcclP2PWork final : public Work {
 public:
  NcclP2PWork(std::shared_ptr<NcclShared> shared, std::shared_ptr<NcclP2PGroup> group,
              std::shared_ptr<NcclFlushLink> link, std::string what)
      : shared_(std::move(shared)), group_(std::move(group)), link_(std::move(link)),
        what_(std::move(what)) {}

  void wait(std::chrono::milliseconds timeout) override {
    if (completed_) return;
    shared_->wait_event(launched(), timeout, what_, /*p2p=*/true);
    completed_ = true;
  }
  void wait() override { wait(shared_->timeout); }
  bool is_completed() override {
    if (!completed_) completed_ = shared_->event_done(launched(), what_);
    return completed_;
  }
  void wait_stream(void* stream) override {
    const cudaEvent_t done = launched();
    const std::string failure = shared_->failed_reason();
    if (!failure.empty()) ZERO_THROW(CommError, "{}: communicator failed: {}", what_, failure);
    cuda_ok(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done, 0), what_);
  }

 private:
  // Launches the group if it is still pending; its completion event, or CommError.
  cudaEvent_t launched() {
    {
      std::lock_guard<std::mutex> lock(link_->mu);
      if (link_->flush) link_->flush();
    }
    std::lock_guard<std::mutex> lock(group_->mu);
    if (!group_->failure.empty()) ZERO_THROW(CommError, "{}: {}", what_, group_->failure);
    if (!group_->launched) ZERO_THROW(CommError, "{}: never launched", what_);
    return group_->done;
  }

  std::shared_ptr<NcclShared> shared_;
  std::shared_ptr<NcclP2PGroup> group_;
  std::shared_ptr<NcclFlushLink> link_;
  std::string what_;
  bool completed_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of an initialized (or initializing) communicator.
  // `store` and `p2p_prefix` (unique to the communicator): where the p2p stall check publishes.
  NcclCommunicator(ncclComm_t comm, ncclResult_t init_result, int rank, int size,
                   NcclOptions options, bool check, std::shared_ptr<Store> store,
                   std::string p2p_prefix)
      : shared_(std::make_shared<NcclShared>()), size_(size), options_(std::move(options)),
        check_(check), store_(std::move(store)), p2p_prefix_(std::move(p2p_prefix)) {
    shared_->comm = comm;
    shared_->rank = rank;
    shared_->device = options_.device;
    shared_->timeout = options_.timeout;
    shared_->settle(init_result, fmt::format("nccl rank {}: communicator init", rank));
    if (rank < 0 || size < 0) {  // a split child: ask NCCL
      int r = 0, n = 0;
      shared_->settle(ncclCommUserRank(comm, &r), "split child: ncclCommUserRank");
      shared_->settle(ncclCommCount(comm, &n), "split child: ncclCommCount");
      shared_->rank = r;
      size_ = n;
    }
    const std::string what = fmt::format("nccl rank {}: setup", shared_->rank);
    if (shared_->device >= 0) cuda_ok(cudaSetDevice(shared_->device), what);
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), what);
    cuda_ok(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), what);
    cuda_ok(cudaMalloc(&device_scratch_, kCallRecordBytes * size_ + 16), what);
    cuda_ok(cudaMallocHost(&host_records_, kCallRecordBytes * size_), what);
    send_seq_.assign(static_cast<size_t>(size_), 0);
    recv_seq_.assign(static_cast<size_t>(size_), 0);
    flush_link_->flush = [this] { flush_p2p(); };
    if (check_ && !options_.check_every_call && store_) {
      shared_->deferred = std::make_unique<NcclShared::Deferred>();
      shared_->deferred->store = store_;
      shared_->deferred->prefix = p2p_prefix_ + "/schedule";
      shared_->deferred->size = size_;
    }
    if (check_ && store_) {
      shared_->stall_check = std::make_unique<P2PStallCheck>(
          shared_->rank, size_, std::min<std::chrono::milliseconds>(kStallDelay, options_.timeout / 4),
          store_exchange(store_, p2p_prefix_, shared_->rank));
    }
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(flush_link_->mu);  // waits out a launch in progress
      flush_link_->flush = nullptr;
    }
    {
      std::lock_guard<std::mutex> issue_lock(issue_mu_);
      drop_pending_p2p("the communicator was destroyed before the transfer was launched");
    }
    DeviceScope device(shared_->device);
    // Let issued work finish (bounded), then release the communicator.
    cudaEvent_t drained = nullptr;
    bool healthy = shared_->failed_reason().empty();
    if (healthy && cudaEventCreateWithFlags(&drained, cudaEventDisableTiming) == cudaSuccess &&
        cudaEventRecord(drained, stream_) == cudaSuccess) {
      try {
        shared_->wait_event(drained, options_.timeout,
                            fmt::format("nccl rank {}: shutdown", shared_->rank));
      } catch (const std::exception& e) {
        ZERO_LOG_ERROR("{}", e.what());
        healthy = false;
      }
    }
    if (drained) cudaEventDestroy(drained);
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (!shared_->aborted) {
        // Non-blocking communicators: finalize (flush) and poll, bounded, before destroying.
        if (healthy) {
          ncclResult_t r = ncclCommFinalize(shared_->comm);
          const auto deadline = Clock::now() + options_.timeout;
          while (r == ncclInProgress && Clock::now() < deadline) {
            std::this_thread::yield();
            ncclCommGetAsyncError(shared_->comm, &r);
          }
          healthy = r == ncclSuccess;
        }
        if (healthy) {
          ncclCommDestroy(shared_->comm);
        } else {
          ncclCommAbort(shared_->comm);
        }
        shared_->aborted = true;
      }
    }
    cudaFreeHost(host_records_);
    cudaFree(device_scratch_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return shared_->rank; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "nccl"; }
  bool accepts(memory::DeviceKind kind) const override { return kind == memory::DeviceKind::kCuda; }
  // Per communicator and thread: a thread issuing on two communicators (the engine's dp and tp
  // groups, a pipeline's) names each one's stream without changing the other's.
  void set_issue_stream(void* stream) override {
    std::lock_guard<std::mutex> issue_lock(issue_mu_);
    caller_streams_[std::this_thread::get_id()] = static_cast<cudaStream_t>(stream);
  }
  void set_call_label(std::string_view label) override {
    std::lock_guard<std::mutex> issue_lock(issue_mu_);
    call_label_ = fit_call_label(label);
  }
  std::chrono::milliseconds default_timeout() const override { return options_.timeout; }

  WorkHandle all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    require_buffer("all_reduce", "buf", buf, count);
    const ncclRedOp_t nop = nccl_op("all_reduce", op);
    const ncclDataType_t t = nccl_type(dtype);
    return issue(make_reduce_call(0, CollectiveKind::kAllReduce, dtype, count, op), [&] {
      return ncclAllReduce(buf, buf, count, t, nop, shared_->comm, stream_);
    });
  }

  WorkHandle reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                            ReduceOp op) override {
    const char* name = "reduce_scatter";
    require_buffer(name, "send", send, recv_count);
    require_buffer(name, "recv", recv, recv_count);
    const size_t bytes = recv_count * dtype_size(dtype);
    const auto* own = static_cast<const uint8_t*>(send) + rank() * bytes;
    if (recv != own && overlaps(send, bytes * size_, recv, bytes)) {
      ZERO_THROW(InvalidArgument,
                 "{}: recv overlaps send but is not the in-place position send + rank() * "
                 "recv_count (rank {}, recv_count {})",
                 name, rank(), recv_count);
    }
    const ncclRedOp_t nop = nccl_op(name, op);
    const ncclDataType_t t = nccl_type(dtype);
    return issue(make_reduce_call(0, CollectiveKind::kReduceScatter, dtype, recv_count, op), [&] {
      return ncclReduceScatter(send, recv, recv_count, t, nop, shared_->comm, stream_);
    });
  }

  WorkHandle all_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    const char* name = "all_gather";
    require_buffer(name, "send", send, send_count);
    require_buffer(name, "recv", recv, send_count);
    const size_t bytes = send_count * dtype_size(dtype);
    const auto* own = static_cast<const uint8_t*>(recv) + rank() * bytes;
    if (send != own && overlaps(send, bytes, recv, bytes * size_)) {
      ZERO_THROW(InvalidArgument,
                 "{}: send overlaps recv but is not the in-place position recv + rank() * "
                 "send_count (rank {}, send_count {})",
                 name, rank(), send_count);
    }
    const ncclDataType_t t = nccl_type(dtype);
    return issue(make_call(0, CollectiveKind::kAllGather, dtype, send_count), [&] {
      return ncclAllGather(send, recv, send_count, t, shared_->comm, stream_);
    });
  }

  WorkHandle broadcast(void* buf, size_t count, DType dtype, int root) override {
    require_buffer("broadcast", "buf", buf, count);
    if (root < 0 || root >= size_) {
      ZERO_THROW(InvalidArgument, "broadcast: root {} is out of range [0, {})", root, size_);
    }
    const ncclDataType_t t = nccl_type(dtype);
    return issue(make_broadcast_call(0, dtype, count, root), [&] {
      return ncclBroadcast(buf, buf, count, t, root, shared_->comm, stream_);
    });
  }

  WorkHandle all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    require_buffer("all_to_all", "send", send, count);
    require_buffer("all_to_all", "recv", recv, count);
    const size_t bytes = count * dtype_size(dtype);
    if (overlaps(send, bytes * size_, recv, bytes * size_)) {
      ZERO_THROW(InvalidArgument, "all_to_all: send and recv overlap (all_to_all is not in place)");
    }
    const ncclDataType_t t = nccl_type(dtype);
    return issue(make_call(0, CollectiveKind::kAllToAll, dtype, count), [&] {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (int p = 0; p < size_ && count > 0; ++p) {
        r = ncclSend(static_cast<const uint8_t*>(send) + p * bytes, count, t, p, shared_->comm,
                     stream_);
        if (r != ncclSuccess && r != ncclInProgress) break;
        r = ncclRecv(static_cast<uint8_t*>(recv) + p * bytes, count, t, p, shared_->comm, stream_);
        if (r != ncclSuccess && r != ncclInProgress) break;
      }
      const ncclResult_t end = ncclGroupEnd();
      return (r != ncclSuccess && r != ncclInProgress) ? r : end;
    });
  }

  WorkHandle barrier() override {
    // A one-element all-reduce on device scratch; waiting on its Work blocks the host.
    void* scratch = static_cast<uint8_t*>(device_scratch_) + kCallRecordBytes * size_;
    return issue(make_call(0, CollectiveKind::kBarrier, DType::kUInt8, 0), [&] {
      return ncclAllReduce(scratch, scratch, 1, ncclInt32, ncclSum, shared_->comm, stream_);
    });
  }

  // Queued, not launched: the group goes out at the first wait on any of its transfers (or the next
  // collective or split), as one ncclGroupStart/End.
  WorkHandle send(const void* buf, size_t count, DType dtype, int peer) override {
    check_p2p_args("send", buf, count, dtype, peer, rank(), size_);
    return add_p2p(true, const_cast<void*>(buf), count, dtype, peer);
  }

  WorkHandle recv(void* buf, size_t count, DType dtype, int peer) override {
    check_p2p_args("recv", buf, count, dtype, peer, rank(), size_);
    return add_p2p(false, buf, count, dtype, peer);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    std::lock_guard<std::mutex> issue_lock(issue_mu_);
    DeviceScope device(shared_->device);
    flush_p2p_locked();
    throw_if_failed("split");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    // Non-blocking, NCCL initializes the child on its own thread and writes the child's handle into
    // split_child_ when that completes (null until then), so the slot is a member, not a local the
    // write could outlive. Until then the parent reports ncclInProgress, and that is the only sign:
    // ncclCommSplit itself may answer ncclSuccess at once (NCCL 2.28 does), so settle() polls the
    // parent whatever the split answered.
    split_child_ = nullptr;
    const ncclResult_t r = ncclCommSplit(shared_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color,
                                         key, &split_child_, &config);
    const std::string what = fmt::format("nccl rank {}: split({}, {})", rank(), color, key);
    // Every rank counts the split, those left out too, so that the children's prefixes agree.
    const std::string child_prefix = fmt::format("{}/split{}/color{}", p2p_prefix_, splits_++, color);
    shared_->settle(r == ncclSuccess ? ncclInProgress : r, what);  // throws on an error or at the timeout
    ncclComm_t child = std::exchange(split_child_, nullptr);
    if (color < 0) return nullptr;
    if (child == nullptr) ZERO_THROW(CommError, "{}: NCCL reported success but gave no communicator", what);
    // The child reports its own rank and size.
    return std::make_unique<NcclCommunicator>(child, ncclSuccess, -1, -1, options_, check_, store_, child_prefix);
  }

 private:
  void throw_if_failed(const std::string& what) {
    const std::string failure = shared_->failed_reason();
    if (!failure.empty()) {
      ZERO_THROW(CommError, "nccl rank {}: {} rejected: communicator failed earlier: {}", rank(),
                 what, failure);
    }
  }

  // Orders the NCCL stream after the caller's stream, runs the schedule check, enqueues the
  // collective and records its completion event.
  template <typename Launch>
  WorkHandle issue(CallInfo call, Launch&& launch) {
    std::lock_guard<std::mutex> issue_lock(issue_mu_);
    DeviceScope device(shared_->device);
    flush_p2p_locked();  // transfers issued before the collective run before it
    call.seq = next_seq_;
    call.label = call_label_;
    const std::string what = fmt::format("nccl rank {}: {}", rank(), describe_call(call));
    throw_if_failed(describe_call(call));
    ++next_seq_;
    cuda_ok(cudaEventRecord(ready_, caller_stream_locked()), what);
    cuda_ok(cudaStreamWaitEvent(stream_, ready_, 0), what);
    if (check_ && options_.check_every_call) run_check(call, what);
    if (shared_->deferred) {
      std::lock_guard<std::mutex> ledger_lock(shared_->deferred->mu);
      shared_->deferred->ledger.record(call);
    }
    shared_->settle(launch(), what);
    cudaEvent_t done = nullptr;
    cuda_ok(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what);
    cuda_ok(cudaEventRecord(done, stream_), what);
    return std::make_shared<NcclWork>(shared_, done, what);
  }

  // The deferred check's comparison (Communicator::verify_schedule): every rank's (digest, count)
  // all-gathered on the NCCL stream after the calls it covers; on a difference the recent calls are
  // compared through the store, and every rank throws the same CommError naming both calls.
  void verify_schedule() override {
    if (!shared_->deferred) return;
    std::lock_guard<std::mutex> issue_lock(issue_mu_);
    DeviceScope device(shared_->device);
    flush_p2p_locked();
    NcclShared::Deferred& d = *shared_->deferred;
    uint64_t mine[2];
    {
      std::lock_guard<std::mutex> ledger_lock(d.mu);
      mine[0] = d.ledger.digest();
      mine[1] = d.ledger.calls();
    }
    const std::string what = fmt::format("nccl rank {}: schedule verification after {} call(s)", rank(), mine[1]);
    throw_if_failed("schedule verification");
    auto* dev = static_cast<uint8_t*>(device_scratch_);
    cuda_ok(cudaMemcpyAsync(dev + rank() * sizeof mine, mine, sizeof mine, cudaMemcpyHostToDevice, stream_), what);
    shared_->settle(ncclAllGather(dev + rank() * sizeof mine, dev, sizeof mine, ncclUint8, shared_->comm, stream_), what);
    cuda_ok(cudaMemcpyAsync(host_records_, dev, sizeof mine * size_, cudaMemcpyDeviceToHost, stream_), what);
    cudaEvent_t gathered = nullptr;
    cuda_ok(cudaEventCreateWithFlags(&gathered, cudaEventDisableTiming), what);
    cuda_ok(cudaEventRecord(gathered, stream_), what);
    try {
      shared_->wait_event(gathered, options_.timeout, what);
    } catch (...) {
      cudaEventDestroy(gathered);
      throw;
    }
    cudaEventDestroy(gathered);
    const auto* all = static_cast<const uint64_t*>(host_records_);
    bool agree = true;
    for (int r = 0; r < size_; ++r) agree = agree && all[2 * r] == mine[0] && all[2 * r + 1] == mine[1];
    std::lock_guard<std::mutex> ledger_lock(d.mu);
    if (agree) {
      d.ledger.mark();
      ++d.verified;
      return;
    }
    std::string mismatch = compare_through_store(*d.store, fmt::format("{}/verify/{}", d.prefix, d.verified), rank(),
                                                 size_, d.ledger, options_.timeout);
    if (mismatch.empty()) mismatch = kDivergedEarlier;
    const std::string msg = fmt::format("{}: {}", what, mismatch);
    shared_->fail_and_abort(msg);
    throw CommError(msg);
  }

  // All-gathers the call records on the NCCL stream and compares them on the host.
  void run_check(const CallInfo& call, const std::string& what) {
    const CallRecord mine = encode_call(call);
    auto* dev = static_cast<uint8_t*>(device_scratch_);
    cuda_ok(cudaMemcpyAsync(dev + rank() * kCallRecordBytes, mine.data(), kCallRecordBytes,
                            cudaMemcpyHostToDevice, stream_),
            what);
    shared_->settle(ncclAllGather(dev + rank() * kCallRecordBytes, dev, kCallRecordBytes,
                                  ncclUint8, shared_->comm, stream_),
                    what + " (schedule check)");
    cuda_ok(cudaMemcpyAsync(host_records_, dev, kCallRecordBytes * size_, cudaMemcpyDeviceToHost,
                            stream_),
            what);
    cudaEvent_t checked = nullptr;
    cuda_ok(cudaEventCreateWithFlags(&checked, cudaEventDisableTiming), what);
    cuda_ok(cudaEventRecord(checked, stream_), what);
    try {
      shared_->wait_event(checked, options_.timeout, what + " (schedule check)");
    } catch (...) {
      cudaEventDestroy(checked);
      throw;
    }
    cudaEventDestroy(checked);
    std::vector<CallRecord> all(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      std::memcpy(all[r].data(), static_cast<uint8_t*>(host_records_) + r * kCallRecordBytes,
                  kCallRecordBytes);
    }
    const std::string mismatch = find_schedule_mismatch(all);
    if (!mismatch.empty()) {
      const std::string msg = fmt::format("{}: {}", what, mismatch);
      shared_->fail_and_abort(msg);
      throw CommError(msg);
    }
  }

  struct PendingP2P {
    bool sending;
    void* buf;
    size_t count;
    ncclDataType_t type;
    int peer;
    cudaEvent_t ready;  // the caller's stream at issue
    std::string what;
    CallInfo call;
    Clock::time_point posted;
  };

  WorkHandle add_p2p(bool sending, void* buf, size_t count, DType dtype, int peer) {
    std::lock_guard<std::mutex> issue_lock(issue_mu_);
    DeviceScope device(shared_->device);
    const ncclDataType_t type = nccl_type(dtype);
    uint64_t& next = (sending ? send_seq_ : recv_seq_)[static_cast<size_t>(peer)];
    CallInfo call = make_p2p_call(next, sending ? CollectiveKind::kSend : CollectiveKind::kRecv,
                                  dtype, count, peer);
    call.label = call_label_;
    const std::string what = fmt::format("nccl rank {}: {}", rank(), describe_call(call));
    throw_if_failed(describe_call(call));
    ++next;
    cudaEvent_t ready = nullptr;
    cuda_ok(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
    const cudaError_t recorded = cudaEventRecord(ready, caller_stream_locked());
    if (recorded != cudaSuccess) {
      cudaEventDestroy(ready);
      cuda_ok(recorded, what);
    }
    if (!group_) group_ = std::make_shared<NcclP2PGroup>();
    pending_.push_back({sending, buf, count, type, peer, ready, what, call, Clock::now()});
    return std::make_shared<NcclP2PWork>(shared_, group_, flush_link_, what);
  }

  void flush_p2p() {
    std::lock_guard<std::mutex> issue_lock(issue_mu_);
    DeviceScope device(shared_->device);
    flush_p2p_locked();
  }

  // Launches the pending transfers as one group after the caller streams they were issued on. A
  // failure is kept in the group (its Works throw it) and fails the communicator. issue_mu_ held.
  void flush_p2p_locked() {
    if (pending_.empty()) return;
    std::vector<PendingP2P> ops;
    ops.swap(pending_);
    std::shared_ptr<NcclP2PGroup> group = std::move(group_);
    group_.reset();
    const std::string what =
        ops.size() == 1 ? ops[0].what
                        : fmt::format("{} (one group with {} more)", ops[0].what, ops.size() - 1);
    std::string failure;
    try {
      throw_if_failed(what);
      for (const PendingP2P& op : ops) cuda_ok(cudaStreamWaitEvent(stream_, op.ready, 0), op.what);
      ncclResult_t r = ncclGroupStart();
      for (size_t i = 0; i < ops.size() && (r == ncclSuccess || r == ncclInProgress); ++i) {
        const PendingP2P& op = ops[i];
        r = op.sending ? ncclSend(op.buf, op.count, op.type, op.peer, shared_->comm, stream_)
                       : ncclRecv(op.buf, op.count, op.type, op.peer, shared_->comm, stream_);
      }
      const ncclResult_t end = ncclGroupEnd();
      shared_->settle((r != ncclSuccess && r != ncclInProgress) ? r : end, what);
      cudaEvent_t done = nullptr;
      cuda_ok(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what);
      const cudaError_t recorded = cudaEventRecord(done, stream_);
      if (recorded != cudaSuccess) {
        cudaEventDestroy(done);
        cuda_ok(recorded, what);
      }
      {
        std::lock_guard<std::mutex> lock(group->mu);
        group->done = done;
        group->launched = true;
      }
      if (shared_->stall_check) {
        std::lock_guard<std::mutex> lock(shared_->stall_mu);
        for (const PendingP2P& op : ops) shared_->launched.push_back({op.call, op.posted, group});
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
    for (const PendingP2P& op : ops) cudaEventDestroy(op.ready);
    if (!failure.empty()) {
      shared_->fail_and_abort(failure);
      std::lock_guard<std::mutex> lock(group->mu);
      group->failure = failure;
    }
  }

  // issue_mu_ held.
  void drop_pending_p2p(const std::string& why) {
    if (pending_.empty()) return;
    for (const PendingP2P& op : pending_) cudaEventDestroy(op.ready);
    pending_.clear();
    const std::shared_ptr<NcclP2PGroup> group = std::move(group_);
    group_.reset();
    std::lock_guard<std::mutex> lock(group->mu);
    group->failure = why;
  }

  std::shared_ptr<NcclShared> shared_;
  int size_;
  const NcclOptions options_;
  const bool check_;
  const std::shared_ptr<Store> store_;  // the p2p stall check's exchange
  const std::string p2p_prefix_;
  int splits_ = 0;  // guarded by issue_mu_
  ncclComm_t split_child_ = nullptr;  // guarded by issue_mu_; written by NCCL during split()
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* device_scratch_ = nullptr;  // size * kCallRecordBytes of records + the barrier word
  void* host_records_ = nullptr;    // pinned
  std::mutex issue_mu_;
  // set_issue_stream's stream per issuing thread (guarded by issue_mu_); none: the legacy default.
  std::map<std::thread::id, cudaStream_t> caller_streams_;
  cudaStream_t caller_stream_locked() const {
    const auto it = caller_streams_.find(std::this_thread::get_id());
    return it == caller_streams_.end() ? nullptr : it->second;
  }
  uint64_t next_seq_ = 0;
  std::string call_label_;  // set_call_label; guarded by issue_mu_
  // Point-to-point (guarded by issue_mu_): the next transfer number per peer and direction, and
  // the transfers issued but not launched yet, with the group their Works wait for.
  std::vector<uint64_t> send_seq_, recv_seq_;
  std::vector<PendingP2P> pending_;
  std::shared_ptr<NcclP2PGroup> group_;
  std::shared_ptr<NcclFlushLink> flush_link_ = std::make_shared<NcclFlushLink>();
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Store> store, int rank,
                                                     int size, const NcclOptions& options) {
  options.validate();
  if (!store) ZERO_THROW(InvalidArgument, "make_nccl_communicator: store is null");
  if (size < 1) ZERO_THROW(InvalidArgument, "make_nccl_communicator: size {} < 1", size);
  if (rank < 0 || rank >= size) {
    ZERO_THROW(InvalidArgument, "make_nccl_communicator: rank {} is out of range [0, {})", rank,
               size);
  }
  const int devices = cuda_device_count();
  if (devices == 0) ZERO_THROW(InvalidArgument, "make_nccl_communicator: no CUDA device visible");
  NcclOptions o = options;
  if (o.device < 0) {
    cuda_ok(cudaGetDevice(&o.device), "make_nccl_communicator: cudaGetDevice");
  }
  if (o.device >= devices) {
    ZERO_THROW(InvalidArgument, "NcclOptions.device {} but only {} device(s) visible", o.device,
               devices);
  }
  cuda_ok(cudaSetDevice(o.device), "make_nccl_communicator: cudaSetDevice");

  // Rank 0 publishes the unique id under a fresh per-instance key.
  const int64_t instance = store->add(fmt::format("{}/instances/{}", o.prefix, rank), 1);
  const std::string key = fmt::format("{}/{}/unique_id", o.prefix, instance);
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      ZERO_THROW(CommError, "nccl rank 0: ncclGetUniqueId failed: {}", ncclGetErrorString(r));
    }
    store->set(key, Bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id));
  } else {
    const Bytes b = store->get(key, o.timeout);
    if (b.size() != sizeof id) {
      ZERO_THROW(CommError, "nccl rank {}: unique id under '{}' has {} bytes, expected {}", rank,
                 key, b.size(), sizeof id);
    }
    std::memcpy(&id, b.data(), sizeof id);
  }
  const bool check = o.check_schedule && schedule_check_from_env(true);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init (and every call) returns at once; we poll with our timeout
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm) ncclCommAbort(comm);
    ZERO_THROW(CommError, "nccl rank {}: ncclCommInitRankConfig failed: {}", rank,
               ncclGetErrorString(r));
  }
  return std::make_unique<NcclCommunicator>(comm, r, rank, size, o, check, store,
                                            fmt::format("{}/{}", o.prefix, instance));
}

}  // namespace zero::comm

#else  // !ZERO_WITH_CUDA

namespace zero::comm {

bool nccl_built() { return false; }
int cuda_device_count() { return 0; }
bool nccl_available() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Store>, int, int,
                                                     const NcclOptions& options) {
  options.validate();
  ZERO_THROW(InvalidArgument,
             "make_nccl_communicator: this build has no CUDA (build with --config=cuda)");
}

}  // namespace zero::comm

#endif  // ZERO_WITH_CUDA
