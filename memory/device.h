#pragma once
// memory::Device: where the engine's buffers live and how the work on them is ordered.
//
// The engine never calls CUDA (or memcpy on a buffer it did not allocate) directly: it allocates,
// copies and runs its few elementwise kernels through a Device, ordering them with streams and
// events as FSDP2 does (copy-in / collective / copy-out on their own streams, events instead of
// blocking waits). Two implementations, and a third for planning (memory/meta_device.h):
//
//   host    (make_host_device)  memory is ordinary aligned host memory. By default every stream
//           runs its work inline, on the calling thread, at the call. In the test mode
//           (HostDeviceOptions::threaded_streams) every stream but the compute stream runs its
//           work on a worker thread of its own, in order, so a missing event wait is a data race
//           that ThreadSanitizer reports on a CPU-only machine.
//   cuda    (make_cuda_device, --config=cuda)  cudaMalloc'd memory on one GPU, CUDA streams and
//           events, the kernels in memory/cuda_kernels.cu.
//
// The compute stream is where the caller's forward and backward run: on the host device that is the
// calling thread itself (work "on" it runs inline), on CUDA the stream given at construction.
//
// Results are the same bits on every implementation: conversions round to nearest even, sums run in
// fp32 in the documented order, block sums of squares follow optim::sum_of_squares.
//
// Every buffer is accounted in the device's MemoryTracker (one per engine, not one per process),
// under the category it was allocated with.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/dtype.h"
#include "memory/block_quantization.h"
#include "memory/buffer.h"
#include "memory/tracker.h"

namespace zero::memory {

// An ordered queue of device work. Opaque: only the Device that created it can use it.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual const std::string& name() const = 0;
};

// A point in a stream's work (after record()). An event never recorded counts as complete.
class Event {
 public:
  virtual ~Event() = default;
};

class Device {
 public:
  virtual ~Device() = default;

  // The memory kind allocate() returns (kHost for the host device, kCuda for a GPU).
  virtual DeviceKind kind() const = 0;
  virtual Location location() const = 0;  // where allocate()'s bytes are accounted ("host", "cuda:0")
  virtual std::string name() const = 0;
  virtual MemoryTracker& tracker() = 0;
  // Whether buffers hold the values written to them (false on the planning device, where large
  // ones are unbacked and no work is done): checks of values have nothing to read there.
  virtual bool holds_values() const { return true; }

  // Zero-filled memory of this device, accounted under `category`. Throws AllocationError naming the
  // size, the category and the device (never returns an empty buffer for bytes > 0).
  virtual Buffer allocate(size_t bytes, Category category) = 0;
  Buffer allocate_elements(int64_t count, DType dtype, Category category);
  // Host memory the device copies to and from fastest (page-locked: cudaHostAlloc with a GPU present,
  // else mlock'ed, else ordinary aligned memory), zero-filled, accounted under `category` at
  // Location::pinned_host() (host() when it could not be locked), in this device's tracker or in
  // `tracker` (a host tier that accounts its own memory, like the optimizer offload's).
  Buffer allocate_host_staging(size_t bytes, Category category);
  virtual Buffer allocate_host_staging(size_t bytes, Category category, MemoryTracker& tracker);

  // Streams and events.
  virtual Stream& compute_stream() = 0;
  virtual std::unique_ptr<Stream> create_stream(const std::string& name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // `event` marks the work issued to `stream` so far.
  virtual void record(Event& event, Stream& stream) = 0;
  // Work issued to `stream` later runs after `event`; never blocks the calling thread (except that
  // on the host device's inline compute stream "later work" is the caller, which must then wait).
  virtual void wait(Stream& stream, const Event& event) = 0;
  // Blocks the calling thread until `event` completed; TimeoutError past `timeout`, naming the
  // device and the stream. A failure in the stream's work (an exception on a host worker thread, a
  // CUDA error) is rethrown here.
  virtual void synchronize(const Event& event, std::chrono::milliseconds timeout) = 0;
  // Blocks until everything issued to `stream` so far completed (tests, shutdown; not the hot path).
  virtual void synchronize(Stream& stream, std::chrono::milliseconds timeout) = 0;

  // Stream-ordered operations. Pointers address memory this device can access (its own buffers;
  // on CUDA also pinned host staging for copy()). Asynchronous except on inline streams.
  // dst[0, bytes) = src[0, bytes), any direction.
  virtual void copy(void* dst, const void* src, size_t bytes, Stream& stream) = 0;
  virtual void fill_zero(void* dst, size_t bytes, Stream& stream) = 0;
  // dst[i] = src[i], converting dtypes (fp32/fp16/bf16; RNE; a plain copy when they match).
  virtual void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
                       Stream& stream) = 0;
  // rows x n elements: dst[r * dst_stride + i] = src[r * src_stride + i], converting as convert()
  // does (strides in elements, each at least n when rows > 1). One operation where a caller would
  // make `rows`: the gradient reducer's pieces take one slice of every rank's chunk, and at a
  // thousand ranks a kernel launch per slice would cost more than the data.
  virtual void convert_rows(const void* src, DType src_dtype, size_t src_stride, void* dst, DType dst_dtype,
                            size_t dst_stride, size_t rows, size_t n, Stream& stream) = 0;
  // dst[i] += src[i] in fp32 arithmetic, rounded once into dst_dtype.
  virtual void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                          Stream& stream) = 0;
  // x[i] *= factor in fp32 arithmetic.
  virtual void scale(void* x, DType dtype, size_t n, float factor, Stream& stream) = 0;
  // out[i] = ins[0*stride + i] + ins[1*stride + i] + ... + ins[(k-1)*stride + i], summed left to
  // right in fp32, written in out_dtype (the deterministic reduction's local sum).
  virtual void ordered_sum(const void* ins, DType in_dtype, size_t stride, int k, void* out,
                           DType out_dtype, size_t n, Stream& stream) = 0;
  // out[j] = optim::sum_of_squares(x + j * block, dtype, block) for j < blocks, bit for bit; `out`
  // holds `blocks` doubles in this device's memory.
  virtual void block_sum_of_squares(const void* x, DType dtype, size_t block, size_t blocks,
                                    double* out, Stream& stream) = 0;
  // Compressed collectives' quantization (memory/block_quantization.h): the segment of src[0, n)
  // (fp32/fp16/bf16) at `segment` (q.segment_bytes(n) bytes); when `nonfinite` is not null (a
  // uint64_t in this device's memory) the count of non-finite elements is added to it.
  virtual void quantize_blocks(const void* src, DType src_dtype, size_t n, const BlockQuantization& q, void* segment,
                               uint64_t* nonfinite, Stream& stream) = 0;
  // rows segments of n elements (segment r at segments + r * segment_stride bytes) into dst + r *
  // dst_stride elements (fp32/fp16/bf16): a gathered unit's every rank in one operation.
  virtual void dequantize_rows(const void* segments, size_t segment_stride, size_t rows, size_t n,
                               const BlockQuantization& q, void* dst, DType dst_dtype, size_t dst_stride,
                               Stream& stream) = 0;
  // Runs `fn` on the host in stream order: after the stream's earlier work, before its later work
  // (host device: on the stream's thread; CUDA: cudaLaunchHostFunc). `fn` must not call the device.
  virtual void host_task(Stream& stream, std::function<void()> fn) = 0;
  // The backend's own handle of `stream` (a cudaStream_t on CUDA, for NCCL and the optimizer's
  // CUDA kernels); nullptr on the host device.
  virtual void* native_handle(Stream& stream) = 0;
};

struct HostDeviceOptions {
  // Test mode: every created stream runs its work on its own worker thread (see the top comment).
  bool threaded_streams = false;
  // How long a wait() may hold up a thread (the caller, when the waiting stream is inline; a worker,
  // when it is threaded) before it fails with TimeoutError. Generous: it only catches a hang. > 0.
  std::chrono::milliseconds wait_timeout = std::chrono::minutes(5);
};

// The host device. `tracker` must outlive it and every buffer it allocated.
std::unique_ptr<Device> make_host_device(MemoryTracker& tracker, HostDeviceOptions options = {});

// True in a --config=cuda build with a visible GPU.
bool cuda_device_usable();
// A CUDA device on GPU `ordinal`; `compute_stream` is a cudaStream_t the caller's forward and
// backward run on (nullptr: the legacy default stream). Throws InvalidArgument in a CPU build and
// zero::Error naming the CUDA error where no such device exists.
std::unique_ptr<Device> make_cuda_device(int ordinal, MemoryTracker& tracker,
                                         void* compute_stream = nullptr);

}  // namespace zero::memory
