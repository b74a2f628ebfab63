// Collective bandwidth, nccl-tests style, for our Gloo communicator against Gloo's own algorithms on
// an identically built Gloo context in the same run (and NCCL on CUDA builds with a GPU).
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/comm/benchmarks/comm_bench
//       [--max-bytes 256M] [--min-bytes 1K] [--check 0|1] [--segment-bytes 256K] [--depth 4]
//       [--gather-segment-bytes 1M] [--eager-bytes 256K] [--rounds 5]
//       [--ops all_reduce,reduce_scatter,all_gather,p2p]
//
// Columns: size (bytes of the whole buffer as nccl-tests counts it), count (elements), type, redop,
// then for ours and for Gloo's: time per call (us: our calls and Gloo's alternate one by one, every
// call is timed on every rank, a call's time is the slowest rank's, and the table shows the median
// of each side over --rounds x (32 MiB / size, clamped to 3..40) calls),
// algbw = size / time (GB/s),
// busbw = algbw * 2(n-1)/n for all_reduce and (n-1)/n for reduce_scatter and all_gather, #wrong
// (elements that differ from the exact expected value after one more call); ratio = our busbw /
// Gloo's. Gloo's own: all_reduce = gloo::allreduce (ring), reduce_scatter =
// gloo::ReduceScatterHalvingDoubling (its only reduce-scatter), all_gather = gloo::allgather (ring).
// p2p (comm/benchmarks/p2p_bench.h): ranks 0 and 1, ours (send/recv) against Gloo's unbound buffers:
// ping-pong latency (half a round trip) and one-way stream bandwidth, up to 64 MiB.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>

#include "base/check.h"
#include "base/logging.h"
#include "comm/benchmarks/p2p_bench.h"
#include "comm/gloo/gloo_collectives.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/launch/dist_env.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/schedule_check.h"

#ifdef ZERO_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace zero::comm {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  size_t min_bytes = 1024;
  size_t max_bytes = size_t{256} << 20;
  bool check = true;
  // Defaults are the communicator's own, so the bench measures what users get.
  size_t segment_bytes = GlooOptions{}.segment_bytes;
  int depth = GlooOptions{}.segment_depth;
  size_t gather_segment_bytes = GlooOptions{}.gather_segment_bytes;
  size_t eager_bytes = GlooOptions{}.eager_bytes;
  // Each size is timed over rounds x iterations(size) calls of each side, interleaved call by call.
  int rounds = 5;
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather", "p2p"};
};

size_t parse_size(const std::string& flag, const std::string& v) {
  size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(v, &pos);
  } catch (const std::exception&) {
    ZERO_THROW(InvalidArgument, "{}: '{}' is not a size", flag, v);
  }
  const std::string unit = v.substr(pos);
  double mult = 1;
  if (unit == "K" || unit == "k") mult = 1024;
  else if (unit == "M" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) ZERO_THROW(InvalidArgument, "{}: unknown unit in '{}'", flag, v);
  return static_cast<size_t>(x * mult);
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) ZERO_THROW(InvalidArgument, "{} needs a value", a);
      return argv[++i];
    };
    if (a == "--min-bytes") f.min_bytes = parse_size(a, value());
    else if (a == "--max-bytes") f.max_bytes = parse_size(a, value());
    else if (a == "--check") f.check = value() != "0";
    else if (a == "--segment-bytes") f.segment_bytes = parse_size(a, value());
    else if (a == "--depth") f.depth = std::stoi(value());
    else if (a == "--gather-segment-bytes") f.gather_segment_bytes = parse_size(a, value());
    else if (a == "--eager-bytes") f.eager_bytes = parse_size(a, value());
    else if (a == "--rounds") f.rounds = std::max(1, std::stoi(value()));
    else if (a == "--ops") {
      f.ops.clear();
      std::string v = value();
      size_t start = 0;
      while (start <= v.size()) {
        const size_t comma = v.find(',', start);
        f.ops.push_back(v.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else {
      ZERO_THROW(InvalidArgument, "unknown flag '{}'", a);
    }
  }
  if (f.min_bytes < 4 || f.max_bytes < f.min_bytes) {
    ZERO_THROW(InvalidArgument, "--min-bytes/--max-bytes: need 4 <= min <= max");
  }
  return f;
}

struct Measure {
  double us = 0;
  size_t wrong = 0;
};

int g_rounds = 5;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Microseconds per call of a and of b. After a warm-up, a and b calls alternate one by one (a b b a
// a b b a ...) for g_rounds rounds of `iters` pairs, so both sides meet the same background load
// at the same moments; each call is timed on every rank and counts as the slowest rank's time. The
// result is the median of each side over all its calls: a call that another process on this
// 2-core machine delayed by a scheduler tick moves neither figure, and a load that comes and goes
// during the run hits both sides alike.
std::pair<double, double> time_pair(Communicator& sync, int warmup, int iters,
                                    const std::function<void()>& a,
                                    const std::function<void()>& b) {
  for (int i = 0; i < warmup; ++i) a();
  for (int i = 0; i < warmup; ++i) b();
  const size_t pairs = static_cast<size_t>(iters) * static_cast<size_t>(g_rounds);
  std::vector<double> t(2 * pairs);  // [a_0, b_0, a_1, b_1, ...]
  auto timed = [](const std::function<void()>& f) {
    const auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  sync.barrier()->wait();
  for (size_t i = 0; i < pairs; ++i) {
    if (i % 2 == 0) {
      t[2 * i] = timed(a);
      t[2 * i + 1] = timed(b);
    } else {
      t[2 * i + 1] = timed(b);
      t[2 * i] = timed(a);
    }
  }
  sync.all_reduce(t.data(), t.size(), DType::kFloat64, ReduceOp::kMax)->wait();
  std::vector<double> ta(pairs), tb(pairs);
  for (size_t i = 0; i < pairs; ++i) {
    ta[i] = t[2 * i];
    tb[i] = t[2 * i + 1];
  }
  return {1e6 * median(ta), 1e6 * median(tb)};
}

size_t count_wrong(const float* got, size_t n, const std::function<float(size_t)>& want) {
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += got[i] != want(i) ? 1 : 0;
  return wrong;
}

size_t sum_wrong(Communicator& sync, size_t wrong) {
  int64_t w = static_cast<int64_t>(wrong);
  sync.all_reduce(&w, 1, DType::kInt64, ReduceOp::kSum)->wait();
  return static_cast<size_t>(w);
}

struct Row {
  std::string op;
  size_t bytes, count;
  Measure ours, theirs;
  bool has_theirs = true;
  std::string theirs_label = "gloo";
};

double bus_factor(const std::string& op, int n) {
  if (n == 1) return 0;
  return op == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

void print_header(const std::string& theirs) {
  std::printf("%12s %12s %6s %6s | %10s %8s %8s %7s | %10s %8s %8s %7s | %6s\n", "size(B)",
              "count", "type", "redop", "ours(us)", "algbw", "busbw", "#wrong",
              (theirs + "(us)").c_str(), "algbw", "busbw", "#wrong", "ratio");
}

void print_row(const Row& r, int n) {
  const double f = bus_factor(r.op, n);
  const double alg_ours = r.bytes / (r.ours.us * 1e3);
  const double alg_theirs = r.bytes / (r.theirs.us * 1e3);
  std::printf("%12zu %12zu %6s %6s | %10.1f %8.3f %8.3f %7zu | %10.1f %8.3f %8.3f %7zu | %6.3f\n",
              r.bytes, r.count, "float", r.op == "all_gather" ? "none" : "sum", r.ours.us,
              alg_ours, alg_ours * f, r.ours.wrong, r.theirs.us, alg_theirs, alg_theirs * f,
              r.theirs.wrong, r.theirs.us / r.ours.us);
  std::fflush(stdout);
}

int iterations(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((size_t{32} << 20) / std::max<size_t>(bytes, 1), 3, 40));
}

// ---- Gloo (ours and Gloo's own) ----

Row bench_all_reduce(Communicator& ours, const std::shared_ptr<gloo::Context>& gctx, size_t bytes) {
  const int n = ours.size(), me = ours.rank();
  const size_t count = bytes / 4;
  std::vector<float> buf(count);
  auto fill = [&] {
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(me + 1 + i % 3);
  };
  auto want = [&](size_t i) { return static_cast<float>(n * (n + 1) / 2 + n * (i % 3)); };
  const int iters = iterations(bytes), warmup = bytes >= (64u << 20) ? 1 : 2;
  Row row{"all_reduce", count * 4, count, {}, {}};

  uint32_t tag = 0;
  auto gloo_run = [&] {
    gloo::AllreduceOptions o(gctx);
    o.setOutput(buf.data(), count);
    o.setReduceFunction([](void* a, const void* b, const void* c, size_t k) {
      gloo::sum<float>(a, b, c, k);
    });
    o.setTag(tag++);
    gloo::allreduce(o);
  };
  auto ours_run = [&] { ours.all_reduce(buf.data(), count, DType::kFloat32, ReduceOp::kSum)->wait(); };
  fill();
  std::tie(row.ours.us, row.theirs.us) = time_pair(ours, warmup, iters, ours_run, gloo_run);
  fill();
  ours_run();
  row.ours.wrong = sum_wrong(ours, count_wrong(buf.data(), count, want));
  fill();
  gloo_run();
  row.theirs.wrong = sum_wrong(ours, count_wrong(buf.data(), count, want));
  return row;
}

Row bench_reduce_scatter(Communicator& ours, const std::shared_ptr<gloo::Context>& gctx,
                         size_t bytes) {
  const int n = ours.size(), me = ours.rank();
  const size_t rc = std::max<size_t>(1, bytes / 4 / n);
  const size_t total = rc * n;
  std::vector<float> send(total), recv(rc);
  auto fill = [&] {
    for (size_t j = 0; j < total; ++j) send[j] = static_cast<float>(me + 1 + j % 5);
  };
  auto want = [&](size_t i) {
    return static_cast<float>(n * (n + 1) / 2 + n * ((static_cast<size_t>(me) * rc + i) % 5));
  };
  const int iters = iterations(total * 4), warmup = total * 4 >= (64u << 20) ? 1 : 2;
  Row row{"reduce_scatter", total * 4, total, {}, {}};

  // Gloo's halving-doubling reduce-scatter works in place on the whole buffer and leaves this
  // rank's chunk at its start; it is built once per size (its constructor allocates and connects).
  std::vector<float> work(total);
  gloo::ReduceScatterHalvingDoubling<float> rs(gctx, {work.data()}, static_cast<int>(total),
                                               std::vector<int>(n, static_cast<int>(rc)));
  auto ours_run = [&] {
    ours.reduce_scatter(send.data(), recv.data(), rc, DType::kFloat32, ReduceOp::kSum)->wait();
  };
  fill();
  std::copy(send.begin(), send.end(), work.begin());
  std::tie(row.ours.us, row.theirs.us) = time_pair(ours, warmup, iters, ours_run, [&] { rs.run(); });
  ours_run();
  row.ours.wrong = sum_wrong(ours, count_wrong(recv.data(), rc, want));
  std::copy(send.begin(), send.end(), work.begin());
  rs.run();
  row.theirs.wrong = sum_wrong(ours, count_wrong(work.data(), rc, want));
  return row;
}

Row bench_all_gather(Communicator& ours, const std::shared_ptr<gloo::Context>& gctx,
                     size_t bytes) {
  const int n = ours.size(), me = ours.rank();
  const size_t sc = std::max<size_t>(1, bytes / 4 / n);
  const size_t total = sc * n;
  std::vector<float> recv(total);
  auto fill = [&] {
    std::fill(recv.begin(), recv.end(), -1.0f);
    for (size_t i = 0; i < sc; ++i) recv[me * sc + i] = static_cast<float>(me * 1000 + i % 1000);
  };
  auto want = [&](size_t i) { return static_cast<float>((i / sc) * 1000 + (i % sc) % 1000); };
  const int iters = iterations(total * 4), warmup = total * 4 >= (64u << 20) ? 1 : 2;
  Row row{"all_gather", total * 4, total, {}, {}};
  float* own = recv.data() + me * sc;

  uint32_t tag = 0;
  auto gloo_run = [&] {
    gloo::AllgatherOptions o(gctx);
    o.setOutput(recv.data(), total);
    o.setTag(tag++);
    gloo::allgather(o);
  };
  auto ours_run = [&] { ours.all_gather(own, recv.data(), sc, DType::kFloat32)->wait(); };
  fill();
  std::tie(row.ours.us, row.theirs.us) = time_pair(ours, warmup, iters, ours_run, gloo_run);
  fill();
  ours_run();
  row.ours.wrong = sum_wrong(ours, count_wrong(recv.data(), total, want));
  fill();
  gloo_run();
  row.theirs.wrong = sum_wrong(ours, count_wrong(recv.data(), total, want));
  return row;
}

#ifdef ZERO_WITH_CUDA
// ---- NCCL: device buffers; "theirs" is the same op through the Gloo communicator on host memory
// (so the ratio column reads NCCL / host Gloo). ----
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) ZERO_THROW(Error, "{}: {}", what, cudaGetErrorString(e));
}

Row bench_nccl(Communicator& nccl, Communicator& host, const std::string& op, size_t bytes) {
  const int n = nccl.size(), me = nccl.rank();
  const size_t chunk = op == "all_reduce" ? bytes / 4 : std::max<size_t>(1, bytes / 4 / n);
  const size_t total = op == "all_reduce" ? chunk : chunk * n;
  std::vector<float> host_buf(total);
  for (size_t i = 0; i < total; ++i) host_buf[i] = static_cast<float>(me + 1 + i % 3);
  float* dev = nullptr;
  cuda_check(cudaMalloc(&dev, total * 4), "cudaMalloc");
  cuda_check(cudaMemcpy(dev, host_buf.data(), total * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  auto run = [&](Communicator& c, float* p) {
    if (op == "all_reduce") c.all_reduce(p, chunk, DType::kFloat32, ReduceOp::kSum)->wait();
    else if (op == "reduce_scatter")
      c.reduce_scatter(p, p + me * chunk, chunk, DType::kFloat32, ReduceOp::kSum)->wait();
    else c.all_gather(p + me * chunk, p, chunk, DType::kFloat32)->wait();
  };
  const int iters = iterations(total * 4);
  Row row{op, total * 4, total, {}, {}};
  row.theirs_label = "gloo";
  std::tie(row.ours.us, row.theirs.us) = time_pair(host, 2, iters, [&] { run(nccl, dev); },
                                                   [&] { run(host, host_buf.data()); });
  cudaFree(dev);
  return row;
}
#endif

int bench_main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  g_rounds = flags.rounds;
  const DistEnv env = read_dist_env();
  set_log_rank(env.rank);
  auto store = connect_store(env, std::chrono::seconds(120));
  GlooOptions go;
  go.timeout = std::chrono::seconds(120);
  go.check_schedule = flags.check;
  go.segment_bytes = flags.segment_bytes;
  go.segment_depth = flags.depth;
  go.gather_segment_bytes = flags.gather_segment_bytes;
  go.eager_bytes = flags.eager_bytes;
  auto ours = make_gloo_communicator(store, env.rank, env.world_size, go);
  auto gctx = connect_gloo_context(store, "comm_bench_gloo", env.rank, env.world_size, "127.0.0.1",
                                   std::chrono::seconds(120));
  const int n = env.world_size;
  if (env.rank == 0) {
    std::printf("# comm_bench: %d ranks, Gloo TCP on 127.0.0.1, fp32 sum, schedule check %s, "
                "segment %zu B x %d, all-gather segment %zu B, eager up to %zu B\n",
                n, go.check_schedule && schedule_check_from_env(true) ? "on" : "off",
                flags.segment_bytes, flags.depth, flags.gather_segment_bytes, flags.eager_bytes);
    std::printf("# ratio = gloo time / ours time (= our busbw / Gloo's busbw)\n");
  }
  for (const std::string& op : flags.ops) {
    if (op != "all_reduce" && op != "reduce_scatter" && op != "all_gather" && op != "p2p") {
      ZERO_THROW(InvalidArgument, "--ops: unknown op '{}'", op);
    }
    if (op == "p2p") {
      if (n < 2) continue;
      if (env.rank == 0) {
        std::printf("\n# p2p: ranks 0 and 1; latency = half a ping-pong round trip, bandwidth = a one-way stream "
                    "of %d messages in flight; ratio = gloo time / ours (latency), ours / gloo (GB/s)\n",
                    kStreamDepth);
        print_p2p_header();
      }
      for (size_t bytes = flags.min_bytes; bytes <= std::min(flags.max_bytes, size_t{64} << 20); bytes *= 2) {
        const P2pRow row = bench_p2p(*ours, gctx, bytes, flags.rounds);
        if (env.rank == 0) print_p2p_row(row);
      }
      continue;
    }
    if (env.rank == 0) {
      std::printf("\n# %s\n", op.c_str());
      print_header("gloo");
    }
    for (size_t bytes = flags.min_bytes; bytes <= flags.max_bytes; bytes *= 2) {
      Row row = op == "all_reduce"       ? bench_all_reduce(*ours, gctx, bytes)
                : op == "reduce_scatter" ? bench_reduce_scatter(*ours, gctx, bytes)
                                         : bench_all_gather(*ours, gctx, bytes);
      if (env.rank == 0) print_row(row, n);
    }
  }
#ifdef ZERO_WITH_CUDA
  if (nccl_available()) {
    NcclOptions no;
    no.device = env.local_rank % cuda_device_count();
    no.check_schedule = flags.check;
    auto nccl = make_nccl_communicator(store, env.rank, env.world_size, no);
    for (const std::string& op : flags.ops) {
      if (op == "p2p") continue;  // NCCL's send/recv rows: not yet
      if (env.rank == 0) {
        std::printf("\n# %s: NCCL (device buffers) vs the Gloo communicator (host)\n", op.c_str());
        print_header("gloo");
      }
      for (size_t bytes = flags.min_bytes; bytes <= flags.max_bytes; bytes *= 2) {
        Row row = bench_nccl(*nccl, *ours, op, bytes);
        if (env.rank == 0) print_row(row, n);
      }
    }
  } else if (env.rank == 0) {
    std::printf("\n# NCCL: no CUDA device visible, skipped\n");
  }
#endif
  ours->barrier()->wait();
  return 0;
}

}  // namespace
}  // namespace zero::comm

int main(int argc, char** argv) {
  try {
    return zero::comm::bench_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_bench: %s\n", e.what());
    return 1;
  }
}
