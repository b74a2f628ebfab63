#pragma once
// Move-only RAII wrappers for CUDA streams and events. CUDA builds only.
//
// Named CudaStream / CudaEvent because memory::Stream and memory::Event are the backend-neutral
// handles of memory/device.h (the CUDA device wraps these).
//
// Host-side waits poll cudaEventQuery against a deadline instead of calling the blocking
// cudaStreamSynchronize / cudaEventSynchronize, so no wait is unbounded: a wait that runs past its
// timeout throws zero::TimeoutError. Other CUDA failures throw zero::Error (ZERO_CUDA_CHECK).
#include <cuda_runtime.h>

#include <chrono>

namespace zero::memory {

class CudaEvent;

class CudaStream {
 public:
  CudaStream() = default;  // holds no stream
  // A new stream on `device`. Non-blocking by default: it does not synchronize with the legacy
  // default stream.
  explicit CudaStream(int device, unsigned int flags = cudaStreamNonBlocking, int priority = 0);
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  bool valid() const { return stream_ != nullptr; }

  // Work issued to this stream later waits until `event` has completed (never blocks the host).
  void wait(const CudaEvent& event);
  // True when all work issued so far has completed.
  bool query() const;
  // Blocks the host until all work issued so far has completed, or throws TimeoutError.
  void synchronize(std::chrono::milliseconds timeout) const;

 private:
  void release();
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

class CudaEvent {
 public:
  CudaEvent() = default;  // holds no event
  // A new event on `device`. Timing is off by default (cheaper record and query).
  explicit CudaEvent(int device, unsigned int flags = cudaEventDisableTiming);
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  cudaEvent_t get() const { return event_; }
  int device() const { return device_; }
  bool valid() const { return event_ != nullptr; }

  // Captures the work issued to `stream` so far.
  void record(const CudaStream& stream);
  // True when the captured work has completed (or the event was never recorded).
  bool query() const;
  // Blocks the host until the captured work has completed, or throws TimeoutError.
  void synchronize(std::chrono::milliseconds timeout) const;
  // Milliseconds from `start` to this event; both need timing enabled and must have completed.
  float elapsed_ms_since(const CudaEvent& start) const;

 private:
  void release();
  cudaEvent_t event_ = nullptr;
  int device_ = 0;
};

}  // namespace zero::memory
