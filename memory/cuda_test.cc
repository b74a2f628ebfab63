// allocate_cuda, CudaStream and CudaEvent on a real GPU: tracked allocation and moves, refused
// allocations, a host -> device -> host round trip across two streams ordered by an event, bounded waits that time
// out while a stream is busy, and event timing.
//
// Prints ZERO_TEST_SKIPPED in CPU builds, and in CUDA builds without a device (after checking that
// allocation and stream creation fail with clean errors there).
#include <doctest/doctest.h>

#include <cstdio>

#ifdef ZERO_WITH_CUDA
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "base/error.h"
#include "memory/buffer.h"
#include "memory/cuda_stream.h"
#include "memory/device_buffer.h"
#include "memory/tracker.h"
#endif

namespace {

#ifndef ZERO_WITH_CUDA

TEST_CASE("CUDA layer") { std::printf("ZERO_TEST_SKIPPED: CPU build (no --config=cuda)\n"); }

#else

using namespace std::chrono_literals;
using zero::memory::Category;
using zero::memory::Location;
using zero::memory::allocate_cuda;
using zero::memory::allocate_cuda_elements;
using zero::memory::Buffer;
using zero::memory::CudaEvent;
using zero::memory::MemoryTracker;
using zero::memory::CudaStream;

bool have_gpu(const char* what) {
  if (zero::memory::cuda_device_available()) return true;
  std::printf("ZERO_TEST_SKIPPED: no CUDA device (%s)\n", what);
  return false;
}

std::string message_of(auto&& f) {
  try {
    f();
  } catch (const zero::Error& e) {
    return e.what();
  }
  return "no exception";
}

TEST_CASE("without a device, allocation and stream creation fail cleanly") {
  if (zero::memory::cuda_device_available()) return;
  const uint64_t before = MemoryTracker::global().current_total();
  std::string m;
  CHECK_THROWS_AS(allocate_cuda(1024, Category::kParams, 0), zero::AllocationError);
  m = message_of([] { allocate_cuda(1024, Category::kParams, 0); });
  INFO(m);
  CHECK(m.find("1024") != std::string::npos);
  CHECK(m.find("params") != std::string::npos);
  CHECK(m.find("cuda:0") != std::string::npos);
  CHECK(MemoryTracker::global().current_total() == before);
  CHECK_THROWS_AS(CudaStream(0), zero::Error);
  CHECK_THROWS_AS(CudaEvent(0), zero::Error);
  Buffer empty = allocate_cuda(0, Category::kParams, 0);  // zero bytes never touch the runtime
  CHECK(empty.data() == nullptr);
  std::printf("ZERO_TEST_SKIPPED: no CUDA device; only the failure paths were tested\n");
}

TEST_CASE("allocate_cuda is tracked under cuda:N and moves count once") {
  if (!have_gpu("allocate_cuda")) return;
  MemoryTracker& g = MemoryTracker::global();
  const Location dev = Location::cuda(0);
  const auto base = g.usage(Category::kGatherWindow, dev);
  {
    Buffer a = allocate_cuda(1 << 20, Category::kGatherWindow, 0);
    REQUIRE(a.data() != nullptr);
    CHECK(a.size_bytes() == size_t{1} << 20);
    CHECK(a.location() == dev);
    CHECK(reinterpret_cast<uintptr_t>(a.data()) % 256 == 0);
    CHECK(g.usage(Category::kGatherWindow, dev).current == base.current + (1 << 20));
    void* p = a.data();
    Buffer b(std::move(a));
    CHECK(b.data() == p);
    CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move)
    Buffer c = allocate_cuda_elements(10, zero::DType::kFloat16, Category::kGatherWindow, 0);
    CHECK(c.size_bytes() == 20);
    CHECK(g.usage(Category::kGatherWindow, dev).allocations == base.allocations + 2);
    c = std::move(b);
    CHECK(c.data() == p);
    CHECK(g.usage(Category::kGatherWindow, dev).current == base.current + (1 << 20));
    CHECK(g.usage(Category::kGatherWindow, dev).allocations == base.allocations + 1);
  }
  CHECK(g.usage(Category::kGatherWindow, dev).current == base.current);
  CHECK(g.usage(Category::kGatherWindow, dev).allocations == base.allocations);
}

TEST_CASE("refused device allocations name size, category, device and the CUDA error") {
  if (!have_gpu("allocate_cuda errors")) return;
  const uint64_t before = MemoryTracker::global().current_total();
  std::string m = message_of([] { allocate_cuda(size_t{1} << 62, Category::kParams, 0); });
  INFO(m);
  CHECK(m.find("4611686018427387904") != std::string::npos);
  CHECK(m.find("params") != std::string::npos);
  CHECK(m.find("cuda:0") != std::string::npos);
  CHECK(m.find("cudaError") != std::string::npos);
  CHECK_THROWS_AS(allocate_cuda(size_t{1} << 62, Category::kParams, 0), zero::AllocationError);
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  m = message_of([count] { allocate_cuda(4096, Category::kGrads, count + 3); });
  CHECK(m.find("cuda:" + std::to_string(count + 3)) != std::string::npos);
  CHECK(m.find("grads") != std::string::npos);
  CHECK_THROWS_AS(allocate_cuda_elements(-1, zero::DType::kFloat32, Category::kGrads, 0),
                  zero::AllocationError);
  CHECK(MemoryTracker::global().current_total() == before);
  // The runtime is still usable: the errors were not sticky and were cleared.
  CHECK(cudaGetLastError() == cudaSuccess);
  Buffer ok = allocate_cuda(64, Category::kGrads, 0);
  CHECK(ok.data() != nullptr);
}

TEST_CASE("round trip across two streams ordered by an event") {
  if (!have_gpu("Stream/Event round trip")) return;
  constexpr size_t kBytes = 8 << 20;
  Buffer src = zero::memory::allocate_pinned(kBytes, Category::kOther);
  Buffer dst = zero::memory::allocate_pinned(kBytes, Category::kOther);
  auto* s = src.as<uint32_t>();
  for (size_t i = 0; i < kBytes / 4; ++i) s[i] = static_cast<uint32_t>(i * 2654435761u);
  Buffer dev = allocate_cuda(kBytes, Category::kOther, 0);

  CudaStream upload(0);
  CudaStream download(0);
  CudaEvent uploaded(0);
  REQUIRE(cudaMemcpyAsync(dev.data(), src.data(), kBytes, cudaMemcpyHostToDevice, upload.get()) ==
          cudaSuccess);
  uploaded.record(upload);
  download.wait(uploaded);  // the download must see the upload's bytes
  REQUIRE(cudaMemcpyAsync(dst.data(), dev.data(), kBytes, cudaMemcpyDeviceToHost,
                          download.get()) == cudaSuccess);
  download.synchronize(10s);
  CHECK(download.query());
  CHECK(uploaded.query());
  CHECK(std::memcmp(src.data(), dst.data(), kBytes) == 0);

  // Moved streams and events keep working.
  CudaStream moved = std::move(download);
  CHECK_FALSE(download.valid());  // NOLINT(bugprone-use-after-move)
  CudaEvent moved_event = std::move(uploaded);
  moved_event.record(moved);
  moved_event.synchronize(10s);
}

void CUDART_CB sleep_300ms(void*) { std::this_thread::sleep_for(300ms); }

TEST_CASE("waits on a busy stream time out, then complete") {
  if (!have_gpu("bounded waits")) return;
  CudaStream s(0);
  // A host function on the stream keeps it busy for 300 ms without any kernel.
  REQUIRE(cudaLaunchHostFunc(s.get(), sleep_300ms, nullptr) == cudaSuccess);
  CudaEvent e(0);
  e.record(s);
  CHECK_FALSE(s.query());
  CHECK_FALSE(e.query());
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(s.synchronize(20ms), zero::TimeoutError);
  CHECK_THROWS_AS(e.synchronize(20ms), zero::TimeoutError);
  CHECK(std::chrono::steady_clock::now() - t0 < 290ms);  // returned on its deadline, not at the end
  e.synchronize(10s);
  s.synchronize(10s);
  CHECK(e.query());
  CHECK(s.query());
}

TEST_CASE("event timing") {
  if (!have_gpu("event timing")) return;
  CudaStream s(0);
  CudaEvent start(0, cudaEventDefault);
  CudaEvent stop(0, cudaEventDefault);
  start.record(s);
  REQUIRE(cudaLaunchHostFunc(s.get(), sleep_300ms, nullptr) == cudaSuccess);
  stop.record(s);
  stop.synchronize(10s);
  const float ms = stop.elapsed_ms_since(start);
  CHECK(ms >= 250.0f);
  // Events created without timing cannot be timed: a CUDA error, thrown as zero::Error.
  CudaEvent untimed_a(0), untimed_b(0);
  untimed_a.record(s);
  untimed_b.record(s);
  untimed_b.synchronize(10s);
  CHECK_THROWS_AS(untimed_b.elapsed_ms_since(untimed_a), zero::Error);
}

#endif

}  // namespace
