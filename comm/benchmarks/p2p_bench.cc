#include "comm/benchmarks/p2p_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include <gloo/transport/unbound_buffer.h>

#include "base/check.h"

namespace zero::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kTimeout(120);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of a and of b, alternating one by one (a b b a ...) so both meet the same
// background load; a call counts as the slower of the two ranks' times.
std::pair<double, double> time_pair(Communicator& sync, int calls, const std::function<void()>& a,
                                    const std::function<void()>& b) {
  for (int i = 0; i < 2; ++i) {
    a();
    b();
  }
  std::vector<double> t(2 * static_cast<size_t>(calls));
  auto timed = [](const std::function<void()>& f) {
    const auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  sync.barrier()->wait();
  for (size_t i = 0; i < static_cast<size_t>(calls); ++i) {
    const bool a_first = i % 2 == 0;
    t[2 * i + (a_first ? 0 : 1)] = timed(a_first ? a : b);
    t[2 * i + (a_first ? 1 : 0)] = timed(a_first ? b : a);
  }
  sync.all_reduce(t.data(), t.size(), DType::kFloat64, ReduceOp::kMax)->wait();
  std::vector<double> ta, tb;
  for (size_t i = 0; i < static_cast<size_t>(calls); ++i) {
    ta.push_back(t[2 * i]);
    tb.push_back(t[2 * i + 1]);
  }
  return {median(ta), median(tb)};
}

int calls_for(size_t bytes, int rounds) {
  return rounds * static_cast<int>(std::clamp<size_t>((size_t{32} << 20) / std::max<size_t>(bytes, 1), 3, 40));
}

}  // namespace

P2pRow bench_p2p(Communicator& ours, const std::shared_ptr<gloo::Context>& gctx, size_t bytes, int rounds) {
  ZERO_CHECK(ours.size() >= 2, "the p2p rows need 2 ranks");
  const int me = ours.rank();
  const bool active = me < 2;
  const int peer = 1 - me;
  P2pRow row;
  row.bytes = bytes;
  std::vector<uint8_t> buf(bytes * kStreamDepth);
  std::unique_ptr<gloo::transport::UnboundBuffer> gbuf;
  if (active) gbuf = gctx->createUnboundBuffer(buf.data(), buf.size());
  uint64_t slot = 0;  // Gloo's own: a fresh slot per message, as a pair's transfers in order

  // Ping-pong: rank 0 sends, rank 1 returns it; half the round trip.
  auto ours_pingpong = [&] {
    if (!active) return;
    if (me == 0) {
      ours.send(buf.data(), bytes, DType::kUInt8, peer)->wait();
      ours.recv(buf.data(), bytes, DType::kUInt8, peer)->wait();
    } else {
      ours.recv(buf.data(), bytes, DType::kUInt8, peer)->wait();
      ours.send(buf.data(), bytes, DType::kUInt8, peer)->wait();
    }
  };
  auto gloo_pingpong = [&] {
    if (!active) return;
    const uint64_t s = slot++;
    if (me == 0) {
      gbuf->send(peer, s, 0, bytes);
      gbuf->waitSend(kTimeout);
      gbuf->recv(peer, s, 0, bytes);
      gbuf->waitRecv(kTimeout);
    } else {
      gbuf->recv(peer, s, 0, bytes);
      gbuf->waitRecv(kTimeout);
      gbuf->send(peer, s, 0, bytes);
      gbuf->waitSend(kTimeout);
    }
  };
  // One-way stream: rank 0 keeps kStreamDepth messages in flight to rank 1.
  auto ours_stream = [&] {
    if (!active) return;
    std::vector<WorkHandle> w;
    for (int k = 0; k < kStreamDepth; ++k) {
      uint8_t* p = buf.data() + static_cast<size_t>(k) * bytes;
      w.push_back(me == 0 ? ours.send(p, bytes, DType::kUInt8, peer) : ours.recv(p, bytes, DType::kUInt8, peer));
    }
    for (auto& h : w) h->wait();
  };
  auto gloo_stream = [&] {
    if (!active) return;
    for (int k = 0; k < kStreamDepth; ++k) {
      const size_t off = static_cast<size_t>(k) * bytes;
      if (me == 0) {
        gbuf->send(peer, slot + static_cast<uint64_t>(k), off, bytes);
      } else {
        gbuf->recv(peer, slot + static_cast<uint64_t>(k), off, bytes);
      }
    }
    for (int k = 0; k < kStreamDepth; ++k) {
      if (me == 0) {
        gbuf->waitSend(kTimeout);
      } else {
        gbuf->waitRecv(kTimeout);
      }
    }
    slot += kStreamDepth;
  };
  const int calls = calls_for(bytes, rounds);
  const auto [ours_pp, gloo_pp] = time_pair(ours, calls, ours_pingpong, gloo_pingpong);
  row.ours_latency_us = 1e6 * ours_pp / 2;
  row.gloo_latency_us = 1e6 * gloo_pp / 2;
  const int stream_calls = std::max(3, calls / kStreamDepth);
  const auto [ours_st, gloo_st] = time_pair(ours, stream_calls, ours_stream, gloo_stream);
  row.ours_stream_gbs = kStreamDepth * static_cast<double>(bytes) / ours_st / 1e9;
  row.gloo_stream_gbs = kStreamDepth * static_cast<double>(bytes) / gloo_st / 1e9;

  // Correctness of ours: a pattern from rank 0 arrives intact at rank 1.
  size_t wrong = 0;
  if (active) {
    for (size_t i = 0; i < bytes; ++i) buf[i] = me == 0 ? static_cast<uint8_t>(i * 131 + 7) : 0;
    if (me == 0) {
      ours.send(buf.data(), bytes, DType::kUInt8, peer)->wait();
    } else {
      ours.recv(buf.data(), bytes, DType::kUInt8, peer)->wait();
      for (size_t i = 0; i < bytes; ++i) wrong += buf[i] != static_cast<uint8_t>(i * 131 + 7);
    }
  }
  int64_t w = static_cast<int64_t>(wrong);
  ours.all_reduce(&w, 1, DType::kInt64, ReduceOp::kSum)->wait();
  row.wrong = static_cast<size_t>(w);
  return row;
}

void print_p2p_header() {
  std::printf("%12s | %10s %10s %6s | %10s %10s %6s | %6s\n", "size(B)", "ours(us)", "gloo(us)", "ratio",
              "ours GB/s", "gloo GB/s", "ratio", "#wrong");
}

void print_p2p_row(const P2pRow& r) {
  std::printf("%12zu | %10.1f %10.1f %6.3f | %10.3f %10.3f %6.3f | %6zu\n", r.bytes, r.ours_latency_us,
              r.gloo_latency_us, r.gloo_latency_us / r.ours_latency_us, r.ours_stream_gbs, r.gloo_stream_gbs,
              r.ours_stream_gbs / r.gloo_stream_gbs, r.wrong);
  std::fflush(stdout);
}

}  // namespace zero::comm
