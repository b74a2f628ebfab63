// The host memory::Device, inline and threaded: every stream-ordered operation against a scalar
// reference (fp32/fp16/bf16, sizes 0 to 100003), event ordering between worker threads, failures and
// timeouts, per-device accounting and allocation errors.
//
// Run under --config=tsan: the ordering tests pass only if an event wait is a real happens-before
// edge. The test "a missing wait is a race" is skipped by default; run it under TSan with
// --test_arg=--no-skip to see the report that the threaded mode exists for.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "memory/buffer.h"
#include "memory/device.h"
#include "memory/device_test_util.h"
#include "memory/tracker.h"

namespace zero::memory {
namespace {

using namespace std::chrono_literals;
using testing::first_difference;
using testing::kFloatTypes;
using testing::kSizes;
using testing::load;
using testing::pattern;
using testing::store;

struct Mode {
  const char* name;
  bool threaded;
};
constexpr Mode kModes[] = {{"inline", false}, {"threaded", true}};

std::string message_of(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no exception";
}

// A device of its own tracker, and one created stream (threaded in that mode).
struct Fixture {
  explicit Fixture(bool threaded)
      : device(make_host_device(tracker, {.threaded_streams = threaded})),
        stream(device->create_stream("work")) {}

  Buffer filled(DType t, size_t n, uint32_t seed, bool finite = false) {
    Buffer b = device->allocate_elements(static_cast<int64_t>(n), t, Category::kOther);
    const auto bytes = pattern(t, n, seed, finite);
    if (!bytes.empty()) std::memcpy(b.data(), bytes.data(), bytes.size());
    return b;
  }
  void sync() { device->synchronize(*stream, 10s); }

  MemoryTracker tracker;
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
};

TEST_CASE("memory: zero-filled, aligned, tracked in the device's tracker, kinds and categories") {
  for (const Mode& mode : kModes) {
    CAPTURE(mode.name);
    Fixture f(mode.threaded);
    Device& d = *f.device;
    CHECK(d.kind() == DeviceKind::kHost);
    CHECK(d.location() == Location::host());
    CHECK(d.name() == "host");
    CHECK(&d.tracker() == &f.tracker);
    {
      Buffer b = d.allocate(1000, Category::kGrads);
      REQUIRE(b.data() != nullptr);
      CHECK(b.size_bytes() == 1000);
      CHECK(b.kind() == DeviceKind::kHost);
      CHECK(b.category() == Category::kGrads);
      CHECK(reinterpret_cast<uintptr_t>(b.data()) % 64 == 0);
      const auto* p = b.as<unsigned char>();
      bool zero = true;
      for (size_t i = 0; i < 1000; ++i) zero &= p[i] == 0;
      CHECK(zero);
      CHECK(f.tracker.usage(Category::kGrads, Location::host()).current == 1000);
      Buffer e = d.allocate_elements(10, DType::kBFloat16, Category::kParams);
      CHECK(e.size_bytes() == 20);
      CHECK(f.tracker.current_total() == 1020);

      // Moves transfer ownership and leave the source empty; assignment frees the old bytes.
      void* data = b.data();
      Buffer moved(std::move(b));
      CHECK(moved.data() == data);
      CHECK(b.data() == nullptr);  // NOLINT(bugprone-use-after-move)
      CHECK(b.size_bytes() == 0);
      CHECK(b.empty());
      moved = std::move(e);
      CHECK(moved.size_bytes() == 20);
      CHECK(f.tracker.current_total() == 20);
      CHECK(f.tracker.usage(Category::kGrads, Location::host()).current == 0);
    }
    CHECK(f.tracker.current_total() == 0);

    Buffer none = d.allocate(0, Category::kParams);
    CHECK(none.empty());
    CHECK(none.data() == nullptr);
    CHECK(f.tracker.usage(Category::kParams).allocations == 0);

    {
      Buffer staging = d.allocate_host_staging(4096, Category::kOffloadHost);
      REQUIRE(staging.data() != nullptr);
      CHECK(staging.size_bytes() == 4096);
      // Pinned if the memlock limit allowed it, else pageable: accounted where it really is.
      const Location where =
          staging.kind() == DeviceKind::kPinnedHost ? Location::pinned_host() : Location::host();
      CHECK((staging.kind() == DeviceKind::kPinnedHost || staging.kind() == DeviceKind::kHost));
      CHECK(f.tracker.usage(Category::kOffloadHost, where).current == 4096);
      CHECK(staging.as<unsigned char>()[4095] == 0);
    }
    CHECK(f.tracker.current_total() == 0);
  }
}

TEST_CASE("two devices with two trackers account separately; the global tracker sees neither") {
  MemoryTracker a_tracker, b_tracker;
  auto a = make_host_device(a_tracker);
  auto b = make_host_device(b_tracker, {.threaded_streams = true});
  const uint64_t global_before = MemoryTracker::global().current_total();
  Buffer x = a->allocate(100, Category::kParams);
  Buffer y = b->allocate(300, Category::kParams);
  Buffer z = b->allocate_host_staging(50, Category::kCommBuffer);
  CHECK(a_tracker.current_total() == 100);
  CHECK(b_tracker.current_total() == 350);
  CHECK(a_tracker.usage(Category::kCommBuffer).current == 0);
  CHECK(MemoryTracker::global().current_total() == global_before);
  y = Buffer();
  CHECK(b_tracker.current_total() == 50);
  CHECK(a_tracker.current_total() == 100);
}

TEST_CASE("a refused allocation names size, category and device and changes no figure") {
  Fixture f(false);
  std::string m = message_of([&] { Buffer b = f.device->allocate(size_t{1} << 62, Category::kParams); });
  INFO(m);
  CHECK(m.find("4611686018427387904") != std::string::npos);
  CHECK(m.find("params") != std::string::npos);
  CHECK(m.find("host") != std::string::npos);
  CHECK_THROWS_AS(f.device->allocate(size_t{1} << 62, Category::kParams), AllocationError);
  CHECK_THROWS_AS(f.device->allocate_elements(-1, DType::kFloat32, Category::kGrads), AllocationError);
  m = message_of([&] { f.device->allocate_elements(-1, DType::kFloat32, Category::kGrads); });
  CHECK(m.find("grads") != std::string::npos);
  CHECK_THROWS_AS(f.device->allocate_host_staging(size_t{1} << 62, Category::kOffloadHost),
                  AllocationError);
  CHECK(f.tracker.current_total() == 0);
}

TEST_CASE("copy and fill_zero") {
  for (const Mode& mode : kModes) {
    for (size_t n : kSizes) {
      CAPTURE(mode.name);
      CAPTURE(n);
      Fixture f(mode.threaded);
      Buffer src = f.filled(DType::kFloat32, n, 7);
      Buffer dst = f.filled(DType::kFloat32, n, 8);
      f.device->copy(dst.data(), src.data(), n * 4, *f.stream);
      f.sync();
      CHECK(first_difference(DType::kFloat32, src.data(), dst.data(), n, false) == n);
      // Part of it, at an odd offset, on the compute stream.
      if (n > 3) {
        f.device->fill_zero(dst.as<char>() + 3, n * 4 - 5, f.device->compute_stream());
        const auto* p = dst.as<unsigned char>();
        const auto* q = src.as<unsigned char>();
        bool ok = p[0] == q[0] && p[1] == q[1] && p[2] == q[2];
        for (size_t i = 3; i < n * 4 - 2; ++i) ok &= p[i] == 0;
        ok &= p[n * 4 - 2] == q[n * 4 - 2] && p[n * 4 - 1] == q[n * 4 - 1];
        CHECK(ok);
      }
    }
  }
}

TEST_CASE("convert_rows: each row as convert gives it, the gaps between rows untouched, overlap refused") {
  for (const Mode& mode : kModes) {
    Fixture f(mode.threaded);
    for (DType from : kFloatTypes) {
      for (DType to : kFloatTypes) {
        for (size_t n : kSizes) {
          CAPTURE(mode.name);
          CAPTURE(dtype_name(from));
          CAPTURE(dtype_name(to));
          CAPTURE(n);
          const size_t rows = 4, ss = n + 3, ds = n + 1;
          Buffer src = f.filled(from, rows * ss, 21 + static_cast<uint32_t>(n));
          Buffer dst = f.filled(to, rows * ds, 22);
          Buffer want = f.filled(to, rows * ds, 22);
          f.device->convert_rows(src.data(), from, ss, dst.data(), to, ds, rows, n, *f.stream);
          for (size_t r = 0; r < rows; ++r) {
            f.device->convert(src.as<char>() + r * ss * dtype_size(from), from,
                              want.as<char>() + r * ds * dtype_size(to), to, n, *f.stream);
          }
          f.sync();
          CHECK(first_difference(to, dst.data(), want.data(), rows * ds, false) == rows * ds);
        }
      }
    }
    Buffer b = f.filled(DType::kFloat32, 16, 1);
    const std::string m = message_of(
        [&] { f.device->convert_rows(b.data(), DType::kFloat32, 3, b.data(), DType::kFloat32, 4, 2, 4, *f.stream); });
    CHECK(m.find("convert_rows") != std::string::npos);
    CHECK(m.find("overlap") != std::string::npos);
  }
}

TEST_CASE("convert: every pair of fp32/fp16/bf16, RNE, NaN payloads and subnormals as base/dtype") {
  for (const Mode& mode : kModes) {
    Fixture f(mode.threaded);
    for (DType from : kFloatTypes) {
      for (DType to : kFloatTypes) {
        for (size_t n : kSizes) {
          CAPTURE(mode.name);
          CAPTURE(dtype_name(from));
          CAPTURE(dtype_name(to));
          CAPTURE(n);
          Buffer src = f.filled(from, n, 11 + static_cast<uint32_t>(n));
          Buffer dst = f.filled(to, n, 12);
          f.device->convert(src.data(), from, dst.data(), to, n, *f.stream);
          std::vector<unsigned char> want(n * dtype_size(to));
          for (size_t i = 0; i < n; ++i) {
            if (from == to) {
              std::memcpy(&want[i * dtype_size(to)], src.as<char>() + i * dtype_size(to),
                          dtype_size(to));
            } else {
              store(to, want.data(), i, load(from, src.data(), i));
            }
          }
          f.sync();
          CHECK(first_difference(to, dst.data(), want.data(), n, false) == n);
        }
      }
    }
  }
}

TEST_CASE("accumulate, scale and ordered_sum in fp32, rounded once") {
  for (const Mode& mode : kModes) {
    Fixture f(mode.threaded);
    for (DType a : kFloatTypes) {
      for (DType b : kFloatTypes) {
        for (size_t n : kSizes) {
          CAPTURE(mode.name);
          CAPTURE(dtype_name(a));
          CAPTURE(dtype_name(b));
          CAPTURE(n);
          const uint32_t seed = 100 + static_cast<uint32_t>(n);

          // accumulate: dst (a) += src (b).
          Buffer dst = f.filled(a, n, seed);
          Buffer src = f.filled(b, n, seed + 1);
          std::vector<unsigned char> want(n * dtype_size(a));
          for (size_t i = 0; i < n; ++i) {
            store(a, want.data(), i, load(a, dst.data(), i) + load(b, src.data(), i));
          }
          f.device->accumulate(dst.data(), a, src.data(), b, n, *f.stream);
          f.sync();
          // Which NaN an add returns when both inputs are NaN is the compiler's operand order.
          CHECK(first_difference(a, dst.data(), want.data(), n, true) == n);

          // ordered_sum: k = 3 inputs (a) at stride n + 5, out (b).
          const size_t stride = n + 5;
          Buffer ins = f.filled(a, 3 * stride, seed + 2);
          Buffer out = f.filled(b, n, seed + 3);
          std::vector<unsigned char> sum(n * dtype_size(b));
          for (size_t i = 0; i < n; ++i) {
            float acc = load(a, ins.data(), i);
            acc = acc + load(a, ins.data(), stride + i);
            acc = acc + load(a, ins.data(), 2 * stride + i);
            store(b, sum.data(), i, acc);
          }
          f.device->ordered_sum(ins.data(), a, stride, 3, out.data(), b, n, *f.stream);
          f.sync();
          CHECK(first_difference(b, out.data(), sum.data(), n, true) == n);
          // k = 1 is a conversion.
          f.device->ordered_sum(ins.data(), a, 0, 1, out.data(), b, n, *f.stream);
          f.sync();
          std::vector<unsigned char> one(n * dtype_size(b));
          for (size_t i = 0; i < n; ++i) store(b, one.data(), i, load(a, ins.data(), i));
          CHECK(first_difference(b, out.data(), one.data(), n, true) == n);
        }
        // scale: once per dtype.
        for (size_t n : kSizes) {
          if (b != DType::kFloat32) continue;
          Buffer x = f.filled(a, n, 300);
          std::vector<unsigned char> want(n * dtype_size(a));
          for (size_t i = 0; i < n; ++i) store(a, want.data(), i, load(a, x.data(), i) * 0.3f);
          f.device->scale(x.data(), a, n, 0.3f, *f.stream);
          f.sync();
          CHECK(first_difference(a, x.data(), want.data(), n, true) == n);
        }
      }
    }
  }
}

TEST_CASE("block_sum_of_squares follows the 16-lane tree per block") {
  struct Shape {
    size_t block, blocks;
  };
  const Shape shapes[] = {{0, 3}, {1, 7}, {7, 1}, {7, 143}, {1000, 100}, {100003, 1}, {5, 0}};
  for (const Mode& mode : kModes) {
    Fixture f(mode.threaded);
    for (DType t : kFloatTypes) {
      for (const Shape& s : shapes) {
        CAPTURE(mode.name);
        CAPTURE(dtype_name(t));
        CAPTURE(s.block);
        CAPTURE(s.blocks);
        Buffer x = f.filled(t, s.block * s.blocks, 500 + static_cast<uint32_t>(s.block), true);
        Buffer out = f.device->allocate_elements(static_cast<int64_t>(s.blocks), DType::kFloat64,
                                                 Category::kOther);
        f.device->block_sum_of_squares(x.data(), t, s.block, s.blocks, out.as<double>(), *f.stream);
        std::vector<double> want(s.blocks);
        for (size_t j = 0; j < s.blocks; ++j) {
          want[j] = testing::reference_sum_of_squares(
              t, x.as<char>() + j * s.block * dtype_size(t), s.block);
        }
        f.sync();
        CHECK(first_difference(out.as<double>(), want.data(), s.blocks, false) == s.blocks);
      }
    }
  }
}

TEST_CASE("bad arguments throw at the call, naming the operation") {
  Fixture f(true);
  Buffer b = f.device->allocate(64, Category::kOther);
  std::string m = message_of(
      [&] { f.device->convert(b.data(), DType::kInt32, b.data(), DType::kFloat32, 4, *f.stream); });
  CHECK(m.find("convert") != std::string::npos);
  CHECK(m.find("int32") != std::string::npos);
  CHECK_THROWS_AS(f.device->scale(b.data(), DType::kFloat64, 4, 2.0f, *f.stream), InvalidArgument);
  CHECK_THROWS_AS(f.device->copy(nullptr, b.data(), 4, *f.stream), InvalidArgument);
  CHECK_THROWS_AS(f.device->ordered_sum(b.data(), DType::kFloat32, 2, 0, b.data(), DType::kFloat32,
                                        2, *f.stream),
                  InvalidArgument);
  CHECK_THROWS_AS(f.device->ordered_sum(b.data(), DType::kFloat32, 1, 2, b.data(), DType::kFloat32,
                                        2, *f.stream),
                  InvalidArgument);
  // Streams and events of another device are refused.
  Fixture other(true);
  CHECK_THROWS_AS(f.device->copy(b.data(), b.data(), 4, *other.stream), CheckError);
  auto e = other.device->create_event();
  CHECK_THROWS_AS(f.device->synchronize(*e, 1s), CheckError);
  // Nothing above reached the stream.
  f.sync();
}

TEST_CASE("threaded streams run on their own thread in order; the compute stream is the caller") {
  Fixture f(true);
  const auto me = std::this_thread::get_id();
  std::thread::id compute_thread, worker_a, worker_b;
  f.device->host_task(f.device->compute_stream(), [&] { compute_thread = std::this_thread::get_id(); });
  CHECK(compute_thread == me);  // ran at the call
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) {
    f.device->host_task(*f.stream, [&, i] {
      if (i == 0) worker_a = std::this_thread::get_id();
      if (i == 99) worker_b = std::this_thread::get_id();
      order.push_back(i);
    });
  }
  f.sync();
  CHECK(worker_a != me);
  CHECK(worker_a == worker_b);
  REQUIRE(order.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(order[static_cast<size_t>(i)] == i);
  CHECK(f.device->native_handle(*f.stream) == nullptr);
  CHECK(f.stream->name() == "work");
  CHECK(f.device->compute_stream().name() == "compute");
}

TEST_CASE("an event orders a consumer stream after a producer stream") {
  for (const Mode& mode : kModes) {
    CAPTURE(mode.name);
    Fixture f(mode.threaded);
    auto consumer = f.device->create_stream("consumer");
    auto produced = f.device->create_event();
    auto consumed = f.device->create_event();
    constexpr size_t n = 1 << 16;
    Buffer a = f.device->allocate_elements(n, DType::kFloat32, Category::kOther);
    Buffer b = f.device->allocate_elements(n, DType::kFloat16, Category::kOther);
    Buffer c = f.device->allocate_elements(n, DType::kFloat32, Category::kOther);
    float* pa = a.as<float>();
    for (int round = 0; round < 20; ++round) {
      // Producer: a is written on its thread (a slow start, so an unordered consumer would lose).
      f.device->host_task(*f.stream, [pa, round] {
        std::this_thread::sleep_for(1ms);
        for (size_t i = 0; i < n; ++i) pa[i] = static_cast<float>(round * 1000 + static_cast<int>(i % 1000));
      });
      f.device->convert(a.data(), DType::kFloat32, b.data(), DType::kFloat16, n, *f.stream);
      f.device->record(*produced, *f.stream);
      // Consumer: reads b only after the producer's event.
      f.device->wait(*consumer, *produced);
      f.device->convert(b.data(), DType::kFloat16, c.data(), DType::kFloat32, n, *consumer);
      f.device->record(*consumed, *consumer);
      // The producer may overwrite a and b only once the consumer is done with them.
      f.device->wait(*f.stream, *consumed);
    }
    f.device->synchronize(*consumed, 10s);
    const float* pc = c.as<float>();
    bool ok = true;
    for (size_t i = 0; i < n; ++i) {
      const float want =
          fp16_bits_to_fp32(fp32_to_fp16_bits(static_cast<float>(19 * 1000 + static_cast<int>(i % 1000))));
      ok &= pc[i] == want;
    }
    CHECK(ok);
    // The caller (compute stream) waits for the consumer: a blocking wait in the threaded mode.
    f.device->host_task(*consumer, [] { std::this_thread::sleep_for(5ms); });
    f.device->record(*consumed, *consumer);
    f.device->wait(f.device->compute_stream(), *consumed);
    f.device->host_task(*consumer, [] {});  // after the wait returned: the event is complete
    f.device->synchronize(*consumed, 0ms);
  }
}

TEST_CASE("an event never recorded is complete; an event covers only the work issued before it") {
  Fixture f(true);
  auto e = f.device->create_event();
  f.device->synchronize(*e, 0ms);
  f.device->wait(*f.stream, *e);
  std::atomic<bool> release{false};
  f.device->host_task(*f.stream, [] {});
  f.device->record(*e, *f.stream);
  f.device->synchronize(*e, 10s);  // the task before the record is done
  f.device->host_task(*f.stream, [&] {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  f.device->synchronize(*e, 0ms);  // not held up by the later task
  CHECK_THROWS_AS(f.device->synchronize(*f.stream, 20ms), TimeoutError);
  release = true;
  f.sync();
}

TEST_CASE("a failed task is rethrown by synchronize; the stream refuses later work") {
  Fixture f(true);
  auto consumer = f.device->create_stream("consumer");
  auto before = f.device->create_event();
  auto after = f.device->create_event();
  int ran = 0;
  // The first task holds the stream until everything below is queued: once the failure has run,
  // the stream refuses new work, and the test must not race the worker to it.
  std::atomic<bool> queued{false};
  f.device->host_task(*f.stream, [&] {
    ++ran;
    while (!queued) std::this_thread::sleep_for(1ms);
  });
  f.device->record(*before, *f.stream);
  f.device->host_task(*f.stream, [] { throw std::runtime_error("boom in the producer"); });
  f.device->host_task(*f.stream, [&] { ran += 100; });  // queued behind the failure: skipped
  f.device->record(*after, *f.stream);
  f.device->wait(*consumer, *after);
  queued = true;

  f.device->synchronize(*before, 10s);  // covers only the work before the failure
  CHECK_THROWS_WITH_AS(f.device->synchronize(*after, 10s), "boom in the producer", std::runtime_error);
  CHECK_THROWS_WITH_AS(f.device->synchronize(*f.stream, 10s), "boom in the producer",
                       std::runtime_error);
  CHECK_THROWS_AS(f.device->synchronize(*f.stream, 10s), std::runtime_error);  // sticky
  CHECK(ran == 1);
  const std::string m = message_of([&] { f.device->host_task(*f.stream, [] {}); });
  CHECK(m.find("failed earlier") != std::string::npos);
  CHECK(m.find("boom in the producer") != std::string::npos);
  // The consumer waited on the failed work, so it failed too, naming both streams.
  const std::string c = message_of([&] { f.device->synchronize(*consumer, 10s); });
  CHECK(c.find("consumer") != std::string::npos);
  CHECK(c.find("work") != std::string::npos);
  CHECK(c.find("boom in the producer") != std::string::npos);

  // Inline: the exception comes from the call itself, and the stream stays usable.
  Fixture g(false);
  CHECK_THROWS_WITH_AS(g.device->host_task(*g.stream, [] { throw std::runtime_error("inline"); }),
                       "inline", std::runtime_error);
  g.device->host_task(*g.stream, [] {});
  g.sync();
}

TEST_CASE("synchronize times out with the device and the stream named, then completes") {
  Fixture f(true);
  auto e = f.device->create_event();
  f.device->host_task(*f.stream, [] { std::this_thread::sleep_for(300ms); });
  f.device->record(*e, *f.stream);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = message_of([&] { f.device->synchronize(*f.stream, 20ms); });
  CHECK(m.find("host") != std::string::npos);
  CHECK(m.find("'work'") != std::string::npos);
  CHECK(m.find("20 ms") != std::string::npos);
  CHECK_THROWS_AS(f.device->synchronize(*e, 20ms), TimeoutError);
  CHECK(std::chrono::steady_clock::now() - t0 < 290ms);
  f.device->synchronize(*e, 10s);
  f.sync();

  // A blocking wait of the inline compute stream is bounded by HostDeviceOptions::wait_timeout.
  MemoryTracker tracker;
  auto d = make_host_device(tracker, {.threaded_streams = true, .wait_timeout = 20ms});
  auto s = d->create_stream("slow");
  auto ev = d->create_event();
  d->host_task(*s, [] { std::this_thread::sleep_for(300ms); });
  d->record(*ev, *s);
  const std::string w = message_of([&] { d->wait(d->compute_stream(), *ev); });
  CHECK(w.find("'compute'") != std::string::npos);
  CHECK(w.find("'slow'") != std::string::npos);
  CHECK_THROWS_AS(d->wait(d->compute_stream(), *ev), TimeoutError);
  // A queued wait that runs past it fails its stream.
  auto t = d->create_stream("waiter");
  d->wait(*t, *ev);
  CHECK_THROWS_AS(d->synchronize(*t, 10s), TimeoutError);
  d->synchronize(*s, 10s);
  CHECK_THROWS_AS(make_host_device(tracker, {.wait_timeout = 0ms}), InvalidArgument);
}

TEST_CASE("destroying a stream drains its queue") {
  Fixture f(true);
  int done = 0;
  {
    auto s = f.device->create_stream("short-lived");
    for (int i = 0; i < 10; ++i) {
      f.device->host_task(*s, [&done] {
        std::this_thread::sleep_for(2ms);
        ++done;
      });
    }
  }
  CHECK(done == 10);  // the join is the happens-before edge
  // An event of a destroyed stream stays usable (and complete).
  auto e = f.device->create_event();
  {
    auto s = f.device->create_stream("gone");
    f.device->host_task(*s, [] {});
    f.device->record(*e, *s);
  }
  f.device->synchronize(*e, 0ms);
  f.device->wait(*f.stream, *e);
  f.sync();
}

TEST_CASE("make_cuda_device without CUDA" * doctest::description("CPU builds only")) {
  if (cuda_device_usable()) return;  // covered by cuda_device_test
  MemoryTracker tracker;
  CHECK_THROWS_AS(make_cuda_device(0, tracker), Error);
}

// The reason for the threaded mode: without the wait, the consumer's read and the producer's write
// run on two threads with no happens-before edge, which TSan reports (and then fails the test).
TEST_CASE("a missing wait is a race (run under TSan with --no-skip)" * doctest::skip()) {
  Fixture f(true);
  auto consumer = f.device->create_stream("consumer");
  Buffer a = f.device->allocate_elements(1024, DType::kFloat32, Category::kOther);
  Buffer b = f.device->allocate_elements(1024, DType::kFloat32, Category::kOther);
  f.device->host_task(*f.stream, [p = a.as<float>()] {
    for (int i = 0; i < 1024; ++i) p[i] = 1.0f;
  });
  f.device->copy(b.data(), a.data(), 4096, *consumer);  // no wait(consumer, event of f.stream)
  f.sync();
  f.device->synchronize(*consumer, 10s);
}

}  // namespace
}  // namespace zero::memory
