// The CUDA memory::Device on a real GPU: every stream-ordered operation bit for bit against the host
// device (fp32/fp16/bf16, sizes 0 to 100003), events across streams, host tasks and their failures,
// bounded waits, accounting under cuda:N and allocation errors.
//
// Prints ZERO_TEST_SKIPPED (and passes) in CPU builds and where no GPU is usable, after checking that
// make_cuda_device refuses cleanly there.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "memory/device.h"
#include "memory/device_test_util.h"
#include "memory/tracker.h"

namespace zero::memory {
namespace {

using namespace std::chrono_literals;
using testing::first_difference;
using testing::kFloatTypes;
using testing::kSizes;
using testing::pattern;

std::string message_of(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no exception";
}

bool have_gpu(const char* what) {
  if (cuda_device_usable()) return true;
  std::printf("ZERO_TEST_SKIPPED: no usable CUDA device (%s)\n", what);
  return false;
}

TEST_CASE("without a usable GPU make_cuda_device refuses cleanly") {
  if (cuda_device_usable()) return;
  MemoryTracker tracker;
  CHECK_THROWS_AS(make_cuda_device(0, tracker), Error);
#ifndef ZERO_WITH_CUDA
  CHECK_THROWS_AS(make_cuda_device(0, tracker), InvalidArgument);
  const std::string m = message_of([&] { make_cuda_device(0, tracker); });
  CHECK(m.find("without CUDA") != std::string::npos);
  std::printf("ZERO_TEST_SKIPPED: CPU build (no --config=cuda)\n");
#else
  std::printf("ZERO_TEST_SKIPPED: no usable CUDA device; only the refusal was tested\n");
#endif
  CHECK(tracker.current_total() == 0);
}

// The same operation on the GPU and on the (inline) host device, with the inputs uploaded through
// pinned staging and the results downloaded again.
struct Pair {
  Pair()
      : gpu(make_cuda_device(0, gpu_tracker)),
        host(make_host_device(host_tracker)),
        stream(gpu->create_stream("work")) {}

  // A device buffer holding `bytes`, via staging on `stream`.
  Buffer upload(const std::vector<unsigned char>& bytes) {
    Buffer d = gpu->allocate(bytes.size(), Category::kOther);
    if (bytes.empty()) return d;
    Buffer staging = gpu->allocate_host_staging(bytes.size(), Category::kOther);
    std::memcpy(staging.data(), bytes.data(), bytes.size());
    gpu->copy(d.data(), staging.data(), bytes.size(), *stream);
    gpu->synchronize(*stream, 30s);  // staging dies here
    return d;
  }
  std::vector<unsigned char> download(const Buffer& d) {
    std::vector<unsigned char> out(d.size_bytes());
    if (out.empty()) return out;
    Buffer staging = gpu->allocate_host_staging(out.size(), Category::kOther);
    gpu->copy(staging.data(), d.data(), out.size(), *stream);
    gpu->synchronize(*stream, 30s);
    std::memcpy(out.data(), staging.data(), out.size());
    return out;
  }
  Buffer host_copy(const std::vector<unsigned char>& bytes) {
    Buffer h = host->allocate(bytes.size(), Category::kOther);
    if (!bytes.empty()) std::memcpy(h.data(), bytes.data(), bytes.size());
    return h;
  }

  MemoryTracker gpu_tracker, host_tracker;
  std::unique_ptr<Device> gpu, host;
  std::unique_ptr<Stream> stream;
};

void check_same(DType t, const std::vector<unsigned char>& gpu, const Buffer& host, size_t n,
                bool nan_equal) {
  REQUIRE(gpu.size() == host.size_bytes());
  const size_t i = first_difference(t, gpu.data(), host.data(), n, nan_equal);
  CAPTURE(i);
  CHECK(i == n);
}

TEST_CASE("convert, accumulate, scale and ordered_sum give the host device's bits") {
  if (!have_gpu("elementwise kernels")) return;
  Pair p;
  Stream& hs = p.host->compute_stream();
  for (DType a : kFloatTypes) {
    for (DType b : kFloatTypes) {
      for (size_t n : kSizes) {
        CAPTURE(dtype_name(a));
        CAPTURE(dtype_name(b));
        CAPTURE(n);
        const uint32_t seed = 17 + static_cast<uint32_t>(n);
        const auto xa = pattern(a, n, seed);
        const auto xb = pattern(b, n, seed + 1);

        // convert a -> b: exact, NaN payloads included (the same integer rounding on both).
        {
          Buffer gs = p.upload(xa), gd = p.upload(xb);
          Buffer hsrc = p.host_copy(xa), hd = p.host_copy(xb);
          p.gpu->convert(gs.data(), a, gd.data(), b, n, *p.stream);
          p.host->convert(hsrc.data(), a, hd.data(), b, n, hs);
          check_same(b, p.download(gd), hd, n, false);
        }
        // convert_rows: 3 rows of n from stride n + 5 into stride n + 2 (a 2-D copy when a == b);
        // the gaps between the destination's rows keep their bits.
        {
          const size_t rows = 3, ss = n + 5, ds = n + 2;
          const auto src = pattern(a, rows * ss, seed + 3), dst = pattern(b, rows * ds, seed + 4);
          Buffer gs = p.upload(src), gd = p.upload(dst);
          Buffer hsrc = p.host_copy(src), hd = p.host_copy(dst);
          p.gpu->convert_rows(gs.data(), a, ss, gd.data(), b, ds, rows, n, *p.stream);
          p.host->convert_rows(hsrc.data(), a, ss, hd.data(), b, ds, rows, n, hs);
          check_same(b, p.download(gd), hd, rows * ds, false);
        }
        // accumulate a += b. The GPU returns the canonical NaN where the host propagates an
        // input's payload, so NaN outputs compare as NaN.
        {
          Buffer gd = p.upload(xa), gs = p.upload(xb);
          Buffer hd = p.host_copy(xa), hsrc = p.host_copy(xb);
          p.gpu->accumulate(gd.data(), a, gs.data(), b, n, *p.stream);
          p.host->accumulate(hd.data(), a, hsrc.data(), b, n, hs);
          check_same(a, p.download(gd), hd, n, true);
        }
        // ordered_sum of k = 3 inputs (a) at stride n + 3 into b; also with finite inputs, exactly.
        for (bool finite : {false, true}) {
          const size_t stride = n + 3;
          const auto ins = pattern(a, 3 * stride, seed + 2, finite);
          Buffer gi = p.upload(ins), go = p.upload(xb);
          Buffer hi = p.host_copy(ins), ho = p.host_copy(xb);
          p.gpu->ordered_sum(gi.data(), a, stride, 3, go.data(), b, n, *p.stream);
          p.host->ordered_sum(hi.data(), a, stride, 3, ho.data(), b, n, hs);
          check_same(b, p.download(go), ho, n, !finite);
        }
      }
    }
    for (size_t n : kSizes) {
      for (float factor : {0.3f, -1.0f / 65536.0f, 3.0e38f}) {
        CAPTURE(dtype_name(a));
        CAPTURE(n);
        CAPTURE(factor);
        const auto x = pattern(a, n, 99 + static_cast<uint32_t>(n));
        Buffer g = p.upload(x);
        Buffer h = p.host_copy(x);
        p.gpu->scale(g.data(), a, n, factor, *p.stream);
        p.host->scale(h.data(), a, n, factor, hs);
        check_same(a, p.download(g), h, n, true);
      }
    }
  }
}

TEST_CASE("block_sum_of_squares gives the host device's doubles") {
  if (!have_gpu("block_sum_of_squares")) return;
  Pair p;
  struct Shape {
    size_t block, blocks;
  };
  const Shape shapes[] = {{0, 3}, {1, 7}, {7, 1}, {7, 143}, {17, 9}, {1000, 100}, {100003, 1}, {5, 0}};
  for (DType t : kFloatTypes) {
    for (const Shape& s : shapes) {
      for (bool finite : {true, false}) {
        CAPTURE(dtype_name(t));
        CAPTURE(s.block);
        CAPTURE(s.blocks);
        CAPTURE(finite);
        const auto x = pattern(t, s.block * s.blocks, 3 + static_cast<uint32_t>(s.block), finite);
        Buffer gx = p.upload(x);
        Buffer gout = p.gpu->allocate(s.blocks * sizeof(double), Category::kOther);
        Buffer hx = p.host_copy(x);
        Buffer hout = p.host->allocate(s.blocks * sizeof(double), Category::kOther);
        p.gpu->block_sum_of_squares(gx.data(), t, s.block, s.blocks, gout.as<double>(), *p.stream);
        p.host->block_sum_of_squares(hx.data(), t, s.block, s.blocks, hout.as<double>(),
                                     p.host->compute_stream());
        const auto got = p.download(gout);
        const size_t i = first_difference(reinterpret_cast<const double*>(got.data()),
                                          hout.as<double>(), s.blocks, !finite);
        CHECK(i == s.blocks);
      }
    }
  }
}

TEST_CASE("allocation is zero-filled and tracked under cuda:0; copy and fill_zero") {
  if (!have_gpu("allocation")) return;
  Pair p;
  Device& g = *p.gpu;
  CHECK(g.kind() == DeviceKind::kCuda);
  CHECK(g.location() == Location::cuda(0));
  CHECK(g.name() == "cuda:0");
  {
    Buffer b = g.allocate(1 << 20, Category::kGatherWindow);
    CHECK(b.kind() == DeviceKind::kCuda);
    CHECK(p.gpu_tracker.usage(Category::kGatherWindow, Location::cuda(0)).current == 1 << 20);
    CHECK(MemoryTracker::global().usage(Category::kGatherWindow, Location::cuda(0)).current == 0);
    const auto bytes = p.download(b);
    bool zero = true;
    for (unsigned char c : bytes) zero &= c == 0;
    CHECK(zero);
    Buffer staging = g.allocate_host_staging(4096, Category::kOffloadHost);
    CHECK(staging.kind() == DeviceKind::kPinnedHost);
    CHECK(p.gpu_tracker.usage(Category::kOffloadHost, Location::pinned_host()).current == 4096);

    // Device to device copy of a pattern, then a partial fill.
    const auto x = pattern(DType::kFloat32, 1000, 5);
    Buffer src = p.upload(x);
    Buffer dst = g.allocate(4000, Category::kOther);
    g.copy(dst.data(), src.data(), 4000, *p.stream);
    g.fill_zero(dst.as<char>() + 8, 100, *p.stream);
    auto want = x;
    std::memset(want.data() + 8, 0, 100);
    CHECK(p.download(dst) == want);
  }
  CHECK(p.gpu_tracker.current_total() == 0);

  const std::string m = message_of([&] { g.allocate(size_t{1} << 62, Category::kParams); });
  INFO(m);
  CHECK(m.find("4611686018427387904") != std::string::npos);
  CHECK(m.find("params") != std::string::npos);
  CHECK(m.find("cuda:0") != std::string::npos);
  CHECK_THROWS_AS(g.allocate(size_t{1} << 62, Category::kParams), AllocationError);
  CHECK(p.gpu_tracker.current_total() == 0);
  CHECK_THROWS_AS(make_cuda_device(1 << 20, p.gpu_tracker), Error);
}

TEST_CASE("quantize_blocks and dequantize_rows give the host device's bytes (stochastic rounding too), the non-finite count too") {
  if (!have_gpu("block quantization")) return;
  Pair p;
  Stream& hs = p.host->compute_stream();
  for (DType a : kFloatTypes) {
    for (size_t n : kSizes) {
      for (int bits : {8, 4}) {
        for (size_t block : {size_t{7}, size_t{256}}) {
         for (uint64_t key : {uint64_t{0}, uint64_t{0xF00D000000000001}}) {  // to nearest, stochastic
          CAPTURE(dtype_name(a));
          CAPTURE(n);
          CAPTURE(bits);
          CAPTURE(block);
          CAPTURE(key);
          const BlockQuantization q{.block = block, .bits = bits, .stochastic_key = key};
          const auto x = pattern(a, n, 29 + static_cast<uint32_t>(n));  // NaN and Inf among them
          const std::vector<unsigned char> zeros(q.segment_bytes(n) + sizeof(uint64_t), 0);
          Buffer gx = p.upload(x), gseg = p.upload(zeros);
          Buffer hx = p.host_copy(x), hseg = p.host_copy(zeros);
          auto* gcount = reinterpret_cast<uint64_t*>(gseg.as<char>() + q.segment_bytes(n));
          auto* hcount = reinterpret_cast<uint64_t*>(hseg.as<char>() + q.segment_bytes(n));
          p.gpu->quantize_blocks(gx.data(), a, n, q, gseg.data(), gcount, *p.stream);
          p.host->quantize_blocks(hx.data(), a, n, q, hseg.data(), hcount, hs);
          const auto segment = p.download(gseg);
          CHECK(std::memcmp(segment.data(), hseg.data(), segment.size()) == 0);
          // Two rows of the segment into every float dtype.
          std::vector<unsigned char> two(2 * q.segment_bytes(n));
          if (!two.empty()) {
            std::memcpy(two.data(), hseg.data(), q.segment_bytes(n));
            std::memcpy(two.data() + q.segment_bytes(n), hseg.data(), q.segment_bytes(n));
          }
          for (DType b : kFloatTypes) {
            const auto init = pattern(b, 2 * n, 3);
            Buffer gs = p.upload(two), gd = p.upload(init);
            Buffer hsrc = p.host_copy(two), hd = p.host_copy(init);
            p.gpu->dequantize_rows(gs.data(), q.segment_bytes(n), 2, n, q, gd.data(), b, n, *p.stream);
            p.host->dequantize_rows(hsrc.data(), q.segment_bytes(n), 2, n, q, hd.data(), b, n, hs);
            check_same(b, p.download(gd), hd, 2 * n, false);
          }
         }
        }
      }
    }
  }
}

TEST_CASE("events order two streams and the compute stream; host tasks run in stream order") {
  if (!have_gpu("events")) return;
  Pair p;
  Device& g = *p.gpu;
  auto consumer = g.create_stream("consumer");
  CHECK(g.native_handle(*consumer) != nullptr);
  CHECK(g.native_handle(g.compute_stream()) == nullptr);  // the legacy default stream, as given
  auto produced = g.create_event();
  constexpr size_t n = 1 << 22;
  Buffer a = g.allocate(n * 4, Category::kOther);
  Buffer b = g.allocate(n * 2, Category::kOther);
  Buffer staging = g.allocate_host_staging(n * 4, Category::kOther);
  auto* s = staging.as<float>();
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<float>(i % 4096);
  int step = 0;
  g.host_task(*p.stream, [&step] {
    std::this_thread::sleep_for(50ms);  // the producer starts late
    step = 1;
  });
  g.copy(a.data(), staging.data(), n * 4, *p.stream);
  g.record(*produced, *p.stream);
  g.wait(*consumer, *produced);
  g.convert(a.data(), DType::kFloat32, b.data(), DType::kBFloat16, n, *consumer);
  g.host_task(*consumer, [&step] { step = step == 1 ? 2 : -1; });
  auto done = g.create_event();
  g.record(*done, *consumer);
  g.wait(g.compute_stream(), *done);
  g.synchronize(g.compute_stream(), 30s);
  g.synchronize(*done, 30s);
  CHECK(step == 2);
  Buffer out = g.allocate_host_staging(n * 2, Category::kOther);
  g.copy(out.data(), b.data(), n * 2, *consumer);
  g.synchronize(*consumer, 30s);
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok &= out.as<uint16_t>()[i] == fp32_to_bf16_bits(s[i]);
  CHECK(ok);
  auto never = g.create_event();
  g.synchronize(*never, 0ms);
}

TEST_CASE("host task failures are rethrown; waits time out naming device and stream") {
  if (!have_gpu("failures")) return;
  Pair p;
  Device& g = *p.gpu;
  auto e = g.create_event();
  g.host_task(*p.stream, [] { std::this_thread::sleep_for(300ms); });
  g.record(*e, *p.stream);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = message_of([&] { g.synchronize(*p.stream, 20ms); });
  CHECK(m.find("cuda:0") != std::string::npos);
  CHECK(m.find("'work'") != std::string::npos);
  CHECK_THROWS_AS(g.synchronize(*e, 20ms), TimeoutError);
  CHECK(std::chrono::steady_clock::now() - t0 < 290ms);
  g.synchronize(*e, 30s);

  auto f = g.create_stream("failing");
  auto after = g.create_event();
  g.host_task(*f, [] { throw std::runtime_error("boom on the GPU stream"); });
  g.record(*after, *f);
  CHECK_THROWS_WITH_AS(g.synchronize(*f, 30s), "boom on the GPU stream", std::runtime_error);
  CHECK_THROWS_AS(g.synchronize(*after, 30s), std::runtime_error);
  const std::string r = message_of([&] { g.host_task(*f, [] {}); });
  CHECK(r.find("failed earlier") != std::string::npos);
  g.synchronize(*p.stream, 30s);  // other streams are unaffected
}

}  // namespace
}  // namespace zero::memory
