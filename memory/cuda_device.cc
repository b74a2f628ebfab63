// The CUDA memory::Device (make_cuda_device; --config=cuda builds): cudaMalloc'd memory on one GPU,
// CudaStream / CudaEvent (memory/cuda_stream.h) behind the backend-neutral Stream / Event, and the
// kernels of cuda_kernels.cu. Every runtime call runs with the device current (DeviceGuard), so the
// caller's current device does not matter and is left as it was.
//
// host_task failures: a host function cannot throw into the CUDA runtime, so its exception is kept
// in the stream's failure slot; later work on that stream is refused, its later host tasks are
// skipped, and synchronize on the stream (or on an event recorded on it) rethrows the exception.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "base/check.h"
#include "memory/buffer.h"
#include "memory/cuda_check.h"
#include "memory/cuda_kernels.h"
#include "memory/cuda_stream.h"
#include "memory/device.h"
#include "memory/device_buffer.h"
#include "memory/device_guard.h"
#include "memory/op_checks.h"

namespace zero::memory {
namespace {

// Zeroing a new allocation is a short memset; this only bounds a hung device.
constexpr std::chrono::milliseconds kAllocationZeroTimeout = std::chrono::minutes(5);

// The first exception of a stream's host tasks (written on a CUDA callback thread).
struct FailureSlot {
  std::mutex mu;
  std::exception_ptr failure;

  std::exception_ptr get() {
    std::lock_guard lock(mu);
    return failure;
  }
  void set_if_first(std::exception_ptr e) {
    std::lock_guard lock(mu);
    if (!failure) failure = std::move(e);
  }
};

class CudaDeviceStream final : public Stream {
 public:
  // An owned, non-blocking stream.
  CudaDeviceStream(const void* owner, std::string name, CudaStream stream)
      : owner_(owner), name_(std::move(name)), owned_(std::move(stream)), handle_(owned_.get()) {}
  // The caller's stream (not owned; nullptr is the legacy default stream).
  CudaDeviceStream(const void* owner, std::string name, cudaStream_t borrowed)
      : owner_(owner), name_(std::move(name)), handle_(borrowed) {}

  const std::string& name() const override { return name_; }
  const void* owner() const { return owner_; }
  cudaStream_t handle() const { return handle_; }
  const std::shared_ptr<FailureSlot>& failure() const { return failure_; }

 private:
  const void* owner_;  // identity of the creating device, never dereferenced
  std::string name_;
  CudaStream owned_;  // empty for the borrowed compute stream
  cudaStream_t handle_ = nullptr;
  std::shared_ptr<FailureSlot> failure_ = std::make_shared<FailureSlot>();
};

class CudaDeviceEvent final : public Event {
 public:
  CudaDeviceEvent(const void* owner, int ordinal) : owner_(owner), event_(ordinal) {}

  const void* owner() const { return owner_; }
  const CudaEvent& event() const { return event_; }

  void recorded_on(const CudaDeviceStream& stream) {
    std::lock_guard lock(mu_);
    stream_name_ = stream.name();
    stream_failure_ = stream.failure();
  }
  // The stream of the last record() ("" if never recorded) and its failure slot.
  std::pair<std::string, std::shared_ptr<FailureSlot>> last_stream() const {
    std::lock_guard lock(mu_);
    return {stream_name_, stream_failure_};
  }

 private:
  const void* owner_;
  CudaEvent event_;
  mutable std::mutex mu_;  // record() and synchronize() may run on different threads
  std::string stream_name_;
  std::shared_ptr<FailureSlot> stream_failure_;
};

struct HostTask {
  std::function<void()> fn;
  std::shared_ptr<FailureSlot> failure;
};

void CUDART_CB run_host_task(void* data) {
  std::unique_ptr<HostTask> task(static_cast<HostTask*>(data));
  if (task->failure->get()) return;  // skipped after an earlier failure, as on the host device
  try {
    task->fn();
  } catch (...) {
    task->failure->set_if_first(std::current_exception());
  }
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, MemoryTracker& tracker, cudaStream_t compute)
      : ordinal_(ordinal),
        name_(Location::cuda(ordinal).name()),
        tracker_(tracker),
        compute_(this, "compute", compute),
        zero_stream_(ordinal) {}

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  Location location() const override { return Location::cuda(ordinal_); }
  std::string name() const override { return name_; }
  MemoryTracker& tracker() override { return tracker_; }

  Buffer allocate(size_t bytes, Category category) override {
    if (bytes == 0) return Buffer(nullptr, location(), category);
    Buffer memory = allocate_cuda(bytes, category, ordinal_, tracker_);  // AllocationError names cuda:N
    {
      // On a private stream, waited for here: the zeros are in place before any stream can use the
      // memory (the legacy default stream would not order against non-blocking streams).
      DeviceGuard guard(ordinal_);
      ZERO_CUDA_CHECK(cudaMemsetAsync(memory.data(), 0, bytes, zero_stream_.get()));
      zero_stream_.synchronize(kAllocationZeroTimeout);
    }
    return memory;
  }

  Stream& compute_stream() override { return compute_; }

  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    return std::make_unique<CudaDeviceStream>(this, name, CudaStream(ordinal_));
  }

  std::unique_ptr<Event> create_event() override {
    return std::make_unique<CudaDeviceEvent>(this, ordinal_);
  }

  void record(Event& event, Stream& stream) override {
    CudaDeviceEvent& e = own(event);
    const CudaDeviceStream& s = own(stream);
    DeviceGuard guard(ordinal_);
    ZERO_CUDA_CHECK(cudaEventRecord(e.event().get(), s.handle()));
    e.recorded_on(s);
  }

  void wait(Stream& stream, const Event& event) override {
    const CudaDeviceStream& s = own(stream);
    const CudaDeviceEvent& e = own(event);
    DeviceGuard guard(ordinal_);
    ZERO_CUDA_CHECK(cudaStreamWaitEvent(s.handle(), e.event().get(), 0));
  }

  void synchronize(const Event& event, std::chrono::milliseconds timeout) override {
    const CudaDeviceEvent& e = own(event);
    auto [stream_name, failure] = e.last_stream();
    await(e.event(), timeout, "event on stream '" + stream_name + "'");
    if (failure) rethrow_if_failed(*failure);
  }

  void synchronize(Stream& stream, std::chrono::milliseconds timeout) override {
    const CudaDeviceStream& s = own(stream);
    CudaEvent done(ordinal_);
    {
      DeviceGuard guard(ordinal_);
      ZERO_CUDA_CHECK(cudaEventRecord(done.get(), s.handle()));
    }
    await(done, timeout, "stream '" + s.name() + "'");
    rethrow_if_failed(*s.failure());
  }

  void copy(void* dst, const void* src, size_t bytes, Stream& stream) override {
    const CudaDeviceStream& s = usable(stream);
    op_checks::pointer(dst, bytes, name_.c_str(), "copy", "dst");
    op_checks::pointer(src, bytes, name_.c_str(), "copy", "src");
    if (bytes == 0 || dst == src) return;
    DeviceGuard guard(ordinal_);
    ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s.handle()));
  }

  void fill_zero(void* dst, size_t bytes, Stream& stream) override {
    const CudaDeviceStream& s = usable(stream);
    op_checks::pointer(dst, bytes, name_.c_str(), "fill_zero", "dst");
    if (bytes == 0) return;
    DeviceGuard guard(ordinal_);
    ZERO_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, s.handle()));
  }

  void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
               Stream& stream) override {
    const CudaDeviceStream& s = usable(stream);
    const char* dev = name_.c_str();
    op_checks::float_dtype(src_dtype, dev, "convert");
    op_checks::float_dtype(dst_dtype, dev, "convert");
    const size_t src_bytes = op_checks::bytes_of(n, src_dtype, dev, "convert");
    op_checks::pointer(src, src_bytes, dev, "convert", "src");
    op_checks::pointer(dst, op_checks::bytes_of(n, dst_dtype, dev, "convert"), dev, "convert", "dst");
    if (n == 0) return;
    DeviceGuard guard(ordinal_);
    if (src_dtype == dst_dtype) {
      if (src != dst) {
        ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, src_bytes, cudaMemcpyDefault, s.handle()));
      }
      return;
    }
    launch("convert", cuda_kernels::convert(src, src_dtype, dst, dst_dtype, n, s.handle()));
  }

  void convert_rows(const void* src, DType src_dtype, size_t src_stride, void* dst, DType dst_dtype, size_t dst_stride,
                    size_t rows, size_t n, Stream& stream) override {
    const CudaDeviceStream& s = usable(stream);
    const char* dev = name_.c_str();
    op_checks::float_dtype(src_dtype, dev, "convert_rows");
    op_checks::float_dtype(dst_dtype, dev, "convert_rows");
    const op_checks::RowExtents e = op_checks::rows(rows, n, src_stride, src_dtype, dst_stride, dst_dtype, dev);
    op_checks::pointer(src, e.src_bytes, dev, "convert_rows", "src");
    op_checks::pointer(dst, e.dst_bytes, dev, "convert_rows", "dst");
    if (rows == 0 || n == 0) return;
    DeviceGuard guard(ordinal_);
    if (src_dtype == dst_dtype) {
      const size_t b = dtype_size(src_dtype);
      ZERO_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_stride * b, src, src_stride * b, n * b, rows, cudaMemcpyDefault,
                                        s.handle()));
      return;
    }
    launch("convert_rows",
           cuda_kernels::convert_rows(src, src_dtype, src_stride, dst, dst_dtype, dst_stride, rows, n, s.handle()));
  }

  void quantize_blocks(const void* src, DType src_dtype, size_t n, const BlockQuantization& q, void* segment,
                       uint64_t* nonfinite, Stream& stream) override {
    const CudaDeviceStream& s = usable(stream);
    const char* dev = name_.c_str();
    const op_checks::QuantizedExtents e = op_checks::quantized(1, n, q, 0, src_dtype, 0, dev, "quantize_blocks");
    op_checks::pointer(src, e.element_bytes, dev, "quantize_blocks", "src");
    op_checks::pointer(segment, e.segment_bytes, dev, "quantize_blocks", "segment");
    if (n == 0) return;
    DeviceGuard guard(ordinal_);
    launch("quantize_blocks",
           cuda_kernels::quantize_blocks(src, src_dtype, n, q.block, q.bits, q.stochastic_key, segment, nonfinite,
                                         s.handle()));
  }

  void dequantize_rows(const void* segments, size_t segment_stride, size_t rows, size_t n, const BlockQuantization& q,
                       void* dst, DType dst_dtype, size_t dst_stride, Stream& stream) override {
    const CudaDeviceStream& s = usable(stream);
    const char* dev = name_.c_str();
    const op_checks::QuantizedExtents e =
        op_checks::quantized(rows, n, q, segment_stride, dst_dtype, dst_stride, dev, "dequantize_rows");
    op_checks::pointer(segments, e.segment_bytes, dev, "dequantize_rows", "segments");
    op_checks::pointer(dst, e.element_bytes, dev, "dequantize_rows", "dst");
    if (rows == 0 || n == 0) return;
    DeviceGuard guard(ordinal_);
    launch("dequantize_rows", cuda_kernels::dequantize_rows(segments, segment_stride, rows, n, q.block, q.bits, dst,
                                                            dst_dtype, dst_stride, s.handle()));
  }

  void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                  Stream& stream) override {
    const CudaDeviceStream& s = usable(stream);
    const char* dev = name_.c_str();
    op_checks::float_dtype(dst_dtype, dev, "accumulate");
    op_checks::float_dtype(src_dtype, dev, "accumulate");
    op_checks::pointer(dst, op_checks::bytes_of(n, dst_dtype, dev, "accumulate"), dev, "accumulate",
                       "dst");
    op_checks::pointer(src, op_checks::bytes_of(n, src_dtype, dev, "accumulate"), dev, "accumulate",
                       "src");
    DeviceGuard guard(ordinal_);
    launch("accumulate", cuda_kernels::accumulate(dst, dst_dtype, src, src_dtype, n, s.handle()));
  }

  void scale(void* x, DType dtype, size_t n, float factor, Stream& stream) override {
    const CudaDeviceStream& s = usable(stream);
    const char* dev = name_.c_str();
    op_checks::float_dtype(dtype, dev, "scale");
    op_checks::pointer(x, op_checks::bytes_of(n, dtype, dev, "scale"), dev, "scale", "x");
    DeviceGuard guard(ordinal_);
    launch("scale", cuda_kernels::scale(x, dtype, n, factor, s.handle()));
  }

  void ordered_sum(const void* ins, DType in_dtype, size_t stride, int k, void* out,
                   DType out_dtype, size_t n, Stream& stream) override {
    const CudaDeviceStream& s = usable(stream);
    const char* dev = name_.c_str();
    op_checks::float_dtype(in_dtype, dev, "ordered_sum");
    op_checks::float_dtype(out_dtype, dev, "ordered_sum");
    op_checks::ordered_sum(k, stride, n, in_dtype, dev);
    op_checks::pointer(ins, n, dev, "ordered_sum", "ins");
    op_checks::pointer(out, n, dev, "ordered_sum", "out");
    DeviceGuard guard(ordinal_);
    launch("ordered_sum", cuda_kernels::ordered_sum(ins, in_dtype, stride, k, out, out_dtype, n,
                                                    s.handle()));
  }

  void block_sum_of_squares(const void* x, DType dtype, size_t block, size_t blocks, double* out,
                            Stream& stream) override {
    const CudaDeviceStream& s = usable(stream);
    const char* dev = name_.c_str();
    op_checks::float_dtype(dtype, dev, "block_sum_of_squares");
    size_t n = 0;
    if (__builtin_mul_overflow(block, blocks, &n)) {
      ZERO_THROW(InvalidArgument, "{} block_sum_of_squares: {} blocks of {} overflow", name_, blocks,
                 block);
    }
    op_checks::pointer(x, op_checks::bytes_of(n, dtype, dev, "block_sum_of_squares"), dev,
                       "block_sum_of_squares", "x");
    op_checks::pointer(out, blocks, dev, "block_sum_of_squares", "out");
    DeviceGuard guard(ordinal_);
    launch("block_sum_of_squares",
           cuda_kernels::block_sum_of_squares(x, dtype, block, blocks, out, s.handle()));
  }

  void host_task(Stream& stream, std::function<void()> fn) override {
    ZERO_CHECK(fn != nullptr, "host_task needs a function");
    const CudaDeviceStream& s = usable(stream);
    auto task = std::make_unique<HostTask>(HostTask{std::move(fn), s.failure()});
    DeviceGuard guard(ordinal_);
    ZERO_CUDA_CHECK(cudaLaunchHostFunc(s.handle(), &run_host_task, task.get()));
    (void)task.release();  // run_host_task owns it now
  }

  void* native_handle(Stream& stream) override { return own(stream).handle(); }

 private:
  CudaDeviceStream& own(Stream& stream) const {
    auto* s = dynamic_cast<CudaDeviceStream*>(&stream);
    ZERO_CHECK(s != nullptr && s->owner() == this, "stream '{}' was not created by device {}",
               stream.name(), name_);
    return *s;
  }
  template <typename E, typename Cuda = std::conditional_t<std::is_const_v<E>,
                                                           const CudaDeviceEvent, CudaDeviceEvent>>
  Cuda& own(E& event) const {  // E: Event or const Event
    auto* e = dynamic_cast<Cuda*>(&event);
    ZERO_CHECK(e != nullptr && e->owner() == this, "event was not created by device {}", name_);
    return *e;
  }

  // A stream of this device that has not failed (new work on a failed stream is refused).
  const CudaDeviceStream& usable(Stream& stream) const {
    const CudaDeviceStream& s = own(stream);
    if (const std::exception_ptr e = s.failure()->get()) {
      ZERO_THROW(Error, "{} stream '{}' failed earlier ({}); no more work is accepted", name_,
                 s.name(), exception_message(e));
    }
    return s;
  }

  void launch(const char* op, int status) const {
    const auto error = static_cast<cudaError_t>(status);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      ZERO_THROW(Error, "{} {}: kernel launch failed: {} ({})", name_, op, cudaGetErrorString(error),
                 cudaGetErrorName(error));
    }
  }

  void await(const CudaEvent& event, std::chrono::milliseconds timeout,
             const std::string& what) const {
    try {
      event.synchronize(timeout);
    } catch (const TimeoutError&) {
      ZERO_THROW(TimeoutError, "{}: {} not complete after {} ms", name_, what, timeout.count());
    }
  }

  static void rethrow_if_failed(FailureSlot& slot) {
    if (const std::exception_ptr e = slot.get()) std::rethrow_exception(e);
  }

  const int ordinal_;
  const std::string name_;
  MemoryTracker& tracker_;
  CudaDeviceStream compute_;
  CudaStream zero_stream_;  // zeroes new allocations
};

}  // namespace

bool cuda_device_usable() { return cuda_device_available(); }

std::unique_ptr<Device> make_cuda_device(int ordinal, MemoryTracker& tracker, void* compute_stream) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    ZERO_THROW(Error, "make_cuda_device({}): no usable CUDA device: {} ({})", ordinal,
               cudaGetErrorString(error), cudaGetErrorName(error));
  }
  if (ordinal < 0 || ordinal >= count) {
    ZERO_THROW(Error, "make_cuda_device({}): no such CUDA device ({} visible): {} ({})", ordinal,
               count, cudaGetErrorString(cudaErrorInvalidDevice),
               cudaGetErrorName(cudaErrorInvalidDevice));
  }
  return std::make_unique<CudaDevice>(ordinal, tracker, static_cast<cudaStream_t>(compute_stream));
}

}  // namespace zero::memory
