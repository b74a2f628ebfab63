#include "memory/cuda_stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "base/check.h"
#include "memory/cuda_check.h"
#include "memory/device_guard.h"
#include "memory/tracker.h"

namespace zero::memory {
namespace {

// cudaSuccess -> true, cudaErrorNotReady -> false, anything else throws.
bool completed(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return true;
  if (status == cudaErrorNotReady) return false;
  detail::throw_cuda_error(__FILE__, __LINE__, what, status);
}

}  // namespace

// ---- CudaStream ----

CudaStream::CudaStream(int device, unsigned int flags, int priority) : device_(device) {
  DeviceGuard guard(device);
  ZERO_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, flags, priority));
}

CudaStream::~CudaStream() { release(); }

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    release();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void CudaStream::release() {
  if (stream_ == nullptr) return;
  // Returns at once; pending work still completes. Nothing to undo on error (e.g. at exit).
  if (cudaStreamDestroy(stream_) != cudaSuccess) (void)cudaGetLastError();
  stream_ = nullptr;
}

void CudaStream::wait(const CudaEvent& event) {
  ZERO_CHECK(valid() && event.valid(), "CudaStream::wait needs a stream and an event");
  ZERO_CUDA_CHECK(cudaStreamWaitEvent(stream_, event.get(), 0));
}

bool CudaStream::query() const {
  ZERO_CHECK(valid(), "CudaStream::query on an empty CudaStream");
  return completed(cudaStreamQuery(stream_), "cudaStreamQuery");
}

void CudaStream::synchronize(std::chrono::milliseconds timeout) const {
  ZERO_CHECK(valid(), "CudaStream::synchronize on an empty CudaStream");
  CudaEvent done(device_);
  ZERO_CUDA_CHECK(cudaEventRecord(done.get(), stream_));
  try {
    done.synchronize(timeout);
  } catch (const TimeoutError&) {
    ZERO_THROW(TimeoutError, "stream on {} still busy after {} ms", Location::cuda(device_).name(),
               timeout.count());
  }
}

// ---- CudaEvent ----

CudaEvent::CudaEvent(int device, unsigned int flags) : device_(device) {
  DeviceGuard guard(device);
  ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&event_, flags));
}

CudaEvent::~CudaEvent() { release(); }

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    release();
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void CudaEvent::release() {
  if (event_ == nullptr) return;
  if (cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
  event_ = nullptr;
}

void CudaEvent::record(const CudaStream& stream) {
  ZERO_CHECK(valid() && stream.valid(), "CudaEvent::record needs an event and a stream");
  ZERO_CUDA_CHECK(cudaEventRecord(event_, stream.get()));
}

bool CudaEvent::query() const {
  ZERO_CHECK(valid(), "CudaEvent::query on an empty CudaEvent");
  return completed(cudaEventQuery(event_), "cudaEventQuery");
}

void CudaEvent::synchronize(std::chrono::milliseconds timeout) const {
  ZERO_CHECK(valid(), "CudaEvent::synchronize on an empty CudaEvent");
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  // Spin briefly (short copies finish in microseconds), then sleep with a growing pause of at most
  // 1 ms so that a long wait costs little CPU.
  auto pause = std::chrono::microseconds(10);
  for (int polls = 0;; ++polls) {
    if (completed(cudaEventQuery(event_), "cudaEventQuery")) return;
    if (Clock::now() >= deadline) {
      ZERO_THROW(TimeoutError, "CUDA event on {} not complete after {} ms",
                 Location::cuda(device_).name(), timeout.count());
    }
    if (polls < 100) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }
}

float CudaEvent::elapsed_ms_since(const CudaEvent& start) const {
  ZERO_CHECK(valid() && start.valid(), "CudaEvent::elapsed_ms_since needs two events");
  float ms = 0.0f;
  ZERO_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), event_));
  return ms;
}

}  // namespace zero::memory
