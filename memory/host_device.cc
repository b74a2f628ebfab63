// The host memory::Device (make_host_device): aligned host memory, inline or threaded streams.
//
// Ordering model. Every stream keeps two counters under its mutex: tasks issued and tasks completed
// (in order, so "completed >= s" means the first s tasks are done). An event is a (stream state,
// issued count) pair; it is complete once the stream's completed count reaches it. A worker
// increments `completed` under the mutex after the task ran, and every waiter reads it under the same
// mutex, so a wait that is present is a happens-before edge for ThreadSanitizer, and a missing one
// leaves the two streams' memory accesses unordered: a reported race.
//
// Failures. An exception from a threaded stream's task is kept (the first one), the stream's later
// queued tasks are skipped, new work is refused, and every synchronize that covers the failed task
// rethrows it. A wait on a failed stream's event fails the waiting stream too (its data would be
// wrong). On an inline stream the exception simply propagates from the call that ran the work.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "base/check.h"
#include "memory/block_quantization.h"
#include "memory/block_quantization_kernels.h"
#include "memory/buffer.h"
#include "memory/device.h"
#include "memory/host_kernels.h"
#include "memory/op_checks.h"

namespace zero::memory {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kDeviceName = "host";

// A deadline `timeout` from now; clamped so that milliseconds::max() does not overflow the clock.
Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  constexpr auto kLongest = std::chrono::hours(24 * 365);
  return Clock::now() + (timeout > kLongest ? kLongest : timeout);
}

// Completion state of one stream. Shared with the events recorded on it, which may outlive it.
struct StreamState {
  explicit StreamState(std::string stream_name) : name(std::move(stream_name)) {}

  const std::string name;
  std::mutex mu;
  std::condition_variable work_cv;  // the worker: a task was queued, or the stream is stopping
  std::condition_variable done_cv;  // waiters: `completed` grew
  std::deque<std::function<void()>> queue;  // threaded streams only
  bool stopping = false;
  uint64_t issued = 0;
  uint64_t completed = 0;
  uint64_t failed_at = 0;  // 1-based number of the first task that threw; 0: none
  std::exception_ptr failure;

  // Throws the failure if it lies within the first `seq` tasks. Needs `mu`.
  void rethrow_if_failed_locked(uint64_t seq) const {
    if (failure && failed_at <= seq) std::rethrow_exception(failure);
  }

  // Waits until the first `seq` tasks completed; false at the deadline. Needs `lock` on `mu`.
  bool wait_locked(std::unique_lock<std::mutex>& lock, uint64_t seq, Clock::time_point deadline) {
    return done_cv.wait_until(lock, deadline, [&] { return completed >= seq; });
  }
};

class HostStream final : public Stream {
 public:
  HostStream(const void* owner, std::string name, bool threaded)
      : owner_(owner), state_(std::make_shared<StreamState>(std::move(name))) {
    if (threaded) worker_ = std::thread([this] { run_worker(); });
  }

  // Drains the queue: every task issued so far runs (or is skipped after a failure) first.
  ~HostStream() override {
    if (!worker_.joinable()) return;
    {
      std::lock_guard lock(state_->mu);
      state_->stopping = true;
    }
    state_->work_cv.notify_one();
    worker_.join();
  }

  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  const std::string& name() const override { return state_->name; }
  const void* owner() const { return owner_; }
  bool threaded() const { return worker_.joinable(); }
  const std::shared_ptr<StreamState>& state() const { return state_; }

  // Inline: runs `task` now, on this thread (an exception propagates to the caller and the task
  // does not count as issued). Threaded: queues it for the worker.
  void submit(std::function<void()> task) {
    if (!threaded()) {
      task();
      std::lock_guard lock(state_->mu);
      ++state_->issued;
      ++state_->completed;
      return;
    }
    {
      std::lock_guard lock(state_->mu);
      if (state_->failure) {
        ZERO_THROW(Error, "{} stream '{}' failed earlier ({}); no more work is accepted", kDeviceName,
                   state_->name, exception_message(state_->failure));
      }
      state_->queue.push_back(std::move(task));
      ++state_->issued;
    }
    state_->work_cv.notify_one();
  }

 private:
  void run_worker() {
    StreamState& s = *state_;
    std::unique_lock lock(s.mu);
    for (;;) {
      s.work_cv.wait(lock, [&] { return !s.queue.empty() || s.stopping; });
      if (s.queue.empty()) return;  // stopping, and everything issued has run
      std::function<void()> task = std::move(s.queue.front());
      s.queue.pop_front();
      const bool skip = s.failure != nullptr;
      lock.unlock();
      std::exception_ptr error;
      if (!skip) {
        try {
          task();
        } catch (...) {
          error = std::current_exception();
        }
      }
      task = nullptr;  // the captures die outside the lock
      lock.lock();
      ++s.completed;
      if (error && !s.failure) {
        s.failure = error;
        s.failed_at = s.completed;
      }
      s.done_cv.notify_all();
    }
  }

  const void* owner_;  // identity of the creating device, never dereferenced
  std::shared_ptr<StreamState> state_;
  std::thread worker_;  // last: started after, joined before, everything it uses
};

class HostEvent final : public Event {
 public:
  explicit HostEvent(const void* owner) : owner_(owner) {}

  const void* owner() const { return owner_; }

  void set(std::shared_ptr<StreamState> state, uint64_t seq) {
    std::lock_guard lock(mu_);
    state_ = std::move(state);
    seq_ = seq;
  }
  // The last record(): (state, seq), or a null state if never recorded.
  std::pair<std::shared_ptr<StreamState>, uint64_t> get() const {
    std::lock_guard lock(mu_);
    return {state_, seq_};
  }

 private:
  const void* owner_;
  mutable std::mutex mu_;  // record() and waits may run on different threads
  std::shared_ptr<StreamState> state_;
  uint64_t seq_ = 0;
};

class HostDevice final : public Device {
 public:
  HostDevice(MemoryTracker& tracker, HostDeviceOptions options)
      : tracker_(tracker), options_(options), compute_(this, "compute", /*threaded=*/false) {}

  DeviceKind kind() const override { return DeviceKind::kHost; }
  Location location() const override { return Location::host(); }
  std::string name() const override { return kDeviceName; }
  MemoryTracker& tracker() override { return tracker_; }

  Buffer allocate(size_t bytes, Category category) override {
    return allocate_host(bytes, category, tracker_);
  }

  Stream& compute_stream() override { return compute_; }

  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    return std::make_unique<HostStream>(this, name, options_.threaded_streams);
  }

  std::unique_ptr<Event> create_event() override { return std::make_unique<HostEvent>(this); }

  void record(Event& event, Stream& stream) override {
    HostStream& s = own(stream);
    uint64_t seq = 0;
    {
      std::lock_guard lock(s.state()->mu);
      seq = s.state()->issued;
    }
    own(event).set(s.state(), seq);
  }

  void wait(Stream& stream, const Event& event) override {
    HostStream& s = own(stream);
    auto [producer_state, recorded] = own(event).get();
    std::shared_ptr<StreamState> producer = std::move(producer_state);
    const uint64_t seq = recorded;
    if (!producer || producer == s.state()) return;  // never recorded, or ordered by the stream
    const auto timeout = options_.wait_timeout;
    if (!s.threaded()) {
      // The waiting "stream" is this thread: block it (bounded), as CUDA would hold its later work.
      await(*producer, seq, timeout, s.name());
      return;
    }
    s.submit([producer = std::move(producer), seq, timeout, waiter = s.name()] {
      await(*producer, seq, timeout, waiter);
    });
  }

  void synchronize(const Event& event, std::chrono::milliseconds timeout) override {
    auto [state, seq] = own(event).get();
    if (!state) return;
    block_until(*state, seq, timeout, "event");
  }

  void synchronize(Stream& stream, std::chrono::milliseconds timeout) override {
    HostStream& s = own(stream);
    uint64_t seq = 0;
    {
      std::lock_guard lock(s.state()->mu);
      seq = s.state()->issued;
    }
    block_until(*s.state(), seq, timeout, "stream");
  }

  void copy(void* dst, const void* src, size_t bytes, Stream& stream) override {
    op_checks::pointer(dst, bytes, kDeviceName, "copy", "dst");
    op_checks::pointer(src, bytes, kDeviceName, "copy", "src");
    submit(stream, [=] {
      if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
    });
  }

  void fill_zero(void* dst, size_t bytes, Stream& stream) override {
    op_checks::pointer(dst, bytes, kDeviceName, "fill_zero", "dst");
    submit(stream, [=] {
      if (bytes > 0) std::memset(dst, 0, bytes);
    });
  }

  void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
               Stream& stream) override {
    op_checks::float_dtype(src_dtype, kDeviceName, "convert");
    op_checks::float_dtype(dst_dtype, kDeviceName, "convert");
    op_checks::pointer(src, op_checks::bytes_of(n, src_dtype, kDeviceName, "convert"), kDeviceName,
                       "convert", "src");
    op_checks::pointer(dst, op_checks::bytes_of(n, dst_dtype, kDeviceName, "convert"), kDeviceName,
                       "convert", "dst");
    submit(stream, [=] { host_kernels::convert(src, src_dtype, dst, dst_dtype, n); });
  }

  void convert_rows(const void* src, DType src_dtype, size_t src_stride, void* dst, DType dst_dtype, size_t dst_stride,
                    size_t rows, size_t n, Stream& stream) override {
    op_checks::float_dtype(src_dtype, kDeviceName, "convert_rows");
    op_checks::float_dtype(dst_dtype, kDeviceName, "convert_rows");
    const op_checks::RowExtents e = op_checks::rows(rows, n, src_stride, src_dtype, dst_stride, dst_dtype, kDeviceName);
    op_checks::pointer(src, e.src_bytes, kDeviceName, "convert_rows", "src");
    op_checks::pointer(dst, e.dst_bytes, kDeviceName, "convert_rows", "dst");
    submit(stream, [=] { host_kernels::convert_rows(src, src_dtype, src_stride, dst, dst_dtype, dst_stride, rows, n); });
  }

  void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                  Stream& stream) override {
    op_checks::float_dtype(dst_dtype, kDeviceName, "accumulate");
    op_checks::float_dtype(src_dtype, kDeviceName, "accumulate");
    op_checks::pointer(dst, op_checks::bytes_of(n, dst_dtype, kDeviceName, "accumulate"),
                       kDeviceName, "accumulate", "dst");
    op_checks::pointer(src, op_checks::bytes_of(n, src_dtype, kDeviceName, "accumulate"),
                       kDeviceName, "accumulate", "src");
    submit(stream, [=] { host_kernels::accumulate(dst, dst_dtype, src, src_dtype, n); });
  }

  void scale(void* x, DType dtype, size_t n, float factor, Stream& stream) override {
    op_checks::float_dtype(dtype, kDeviceName, "scale");
    op_checks::pointer(x, op_checks::bytes_of(n, dtype, kDeviceName, "scale"), kDeviceName, "scale",
                       "x");
    submit(stream, [=] { host_kernels::scale(x, dtype, n, factor); });
  }

  void ordered_sum(const void* ins, DType in_dtype, size_t stride, int k, void* out,
                   DType out_dtype, size_t n, Stream& stream) override {
    op_checks::float_dtype(in_dtype, kDeviceName, "ordered_sum");
    op_checks::float_dtype(out_dtype, kDeviceName, "ordered_sum");
    op_checks::ordered_sum(k, stride, n, in_dtype, kDeviceName);
    op_checks::pointer(ins, n, kDeviceName, "ordered_sum", "ins");
    op_checks::pointer(out, n, kDeviceName, "ordered_sum", "out");
    submit(stream,
           [=] { host_kernels::ordered_sum(ins, in_dtype, stride, k, out, out_dtype, n); });
  }

  void block_sum_of_squares(const void* x, DType dtype, size_t block, size_t blocks, double* out,
                            Stream& stream) override {
    op_checks::float_dtype(dtype, kDeviceName, "block_sum_of_squares");
    size_t n = 0;
    if (__builtin_mul_overflow(block, blocks, &n)) {
      ZERO_THROW(InvalidArgument, "{} block_sum_of_squares: {} blocks of {} overflow", kDeviceName,
                 blocks, block);
    }
    op_checks::pointer(x, op_checks::bytes_of(n, dtype, kDeviceName, "block_sum_of_squares"),
                       kDeviceName, "block_sum_of_squares", "x");
    op_checks::pointer(out, blocks, kDeviceName, "block_sum_of_squares", "out");
    submit(stream, [=] { host_kernels::block_sum_of_squares(x, dtype, block, blocks, out); });
  }

  void quantize_blocks(const void* src, DType src_dtype, size_t n, const BlockQuantization& q, void* segment,
                       uint64_t* nonfinite, Stream& stream) override {
    const op_checks::QuantizedExtents e =
        op_checks::quantized(1, n, q, 0, src_dtype, 0, kDeviceName, "quantize_blocks");
    op_checks::pointer(src, e.element_bytes, kDeviceName, "quantize_blocks", "src");
    op_checks::pointer(segment, e.segment_bytes, kDeviceName, "quantize_blocks", "segment");
    submit(stream, [=] {
      const uint64_t bad = host_kernels::quantize_blocks(src, src_dtype, n, q, segment);
      if (nonfinite != nullptr) *nonfinite += bad;
    });
  }

  void dequantize_rows(const void* segments, size_t segment_stride, size_t rows, size_t n, const BlockQuantization& q,
                       void* dst, DType dst_dtype, size_t dst_stride, Stream& stream) override {
    const op_checks::QuantizedExtents e =
        op_checks::quantized(rows, n, q, segment_stride, dst_dtype, dst_stride, kDeviceName, "dequantize_rows");
    op_checks::pointer(segments, e.segment_bytes, kDeviceName, "dequantize_rows", "segments");
    op_checks::pointer(dst, e.element_bytes, kDeviceName, "dequantize_rows", "dst");
    submit(stream, [=] {
      host_kernels::dequantize_rows(segments, segment_stride, rows, n, q, dst, dst_dtype, dst_stride);
    });
  }

  void host_task(Stream& stream, std::function<void()> fn) override {
    ZERO_CHECK(fn != nullptr, "host_task needs a function");
    submit(stream, std::move(fn));
  }

  void* native_handle(Stream& stream) override {
    own(stream);
    return nullptr;
  }

 private:
  HostStream& own(Stream& stream) const {
    auto* s = dynamic_cast<HostStream*>(&stream);
    ZERO_CHECK(s != nullptr && s->owner() == this, "stream '{}' was not created by this {} device",
               stream.name(), kDeviceName);
    return *s;
  }
  template <typename E, typename Host = std::conditional_t<std::is_const_v<E>, const HostEvent,
                                                           HostEvent>>  // E: Event or const Event
  Host& own(E& event) const {
    auto* e = dynamic_cast<Host*>(&event);
    ZERO_CHECK(e != nullptr && e->owner() == this, "event was not created by this {} device",
               kDeviceName);
    return *e;
  }

  void submit(Stream& stream, std::function<void()> task) const { own(stream).submit(std::move(task)); }

  // A wait() that holds up a thread: until `producer` completed its first `seq` tasks. Fails on a
  // failed producer (the waiter's data would be wrong) and after `timeout` (a hang).
  static void await(StreamState& producer, uint64_t seq, std::chrono::milliseconds timeout,
                    const std::string& waiter) {
    std::unique_lock lock(producer.mu);
    if (!producer.wait_locked(lock, seq, deadline_after(timeout))) {
      ZERO_THROW(TimeoutError,
                 "{} stream '{}' waited {} ms for an event of stream '{}' (task {}, {} completed)",
                 kDeviceName, waiter, timeout.count(), producer.name, seq, producer.completed);
    }
    if (producer.failure && producer.failed_at <= seq) {
      ZERO_THROW(Error, "{} stream '{}' waited for an event of stream '{}', whose work failed: {}",
                 kDeviceName, waiter, producer.name, exception_message(producer.failure));
    }
  }

  // synchronize(): until the first `seq` tasks of `state` completed, rethrowing their failure.
  static void block_until(StreamState& state, uint64_t seq, std::chrono::milliseconds timeout,
                          const char* what) {
    std::unique_lock lock(state.mu);
    if (!state.wait_locked(lock, seq, deadline_after(timeout))) {
      ZERO_THROW(TimeoutError,
                 "{} device: {} on stream '{}' not complete after {} ms (task {}, {} completed)",
                 kDeviceName, what, state.name, timeout.count(), seq, state.completed);
    }
    state.rethrow_if_failed_locked(seq);
  }

  MemoryTracker& tracker_;
  const HostDeviceOptions options_;
  HostStream compute_;  // inline: the caller's thread
};

}  // namespace

std::unique_ptr<Device> make_host_device(MemoryTracker& tracker, HostDeviceOptions options) {
  if (options.wait_timeout <= std::chrono::milliseconds::zero()) {
    ZERO_THROW(InvalidArgument, "HostDeviceOptions::wait_timeout must be > 0 (got {} ms)",
               options.wait_timeout.count());
  }
  return std::make_unique<HostDevice>(tracker, options);
}

}  // namespace zero::memory
