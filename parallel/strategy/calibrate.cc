#include "parallel/strategy/calibrate.h"

#include <Eigen/Dense>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <thread>

#include "base/check.h"
#include "parallel/strategy/gpt2.h"
#include "zero/engine.h"

namespace zero::strategy {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  ZERO_CHECK(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<double> mean_over_ranks(comm::Communicator& world, std::vector<double> values) {
  if (!values.empty()) world.all_reduce(values.data(), values.size(), DType::kFloat64, comm::ReduceOp::kAvg)->wait();
  return values;
}

namespace {

// The link.

constexpr size_t kMinBytes = 1 << 10, kMaxBytes = 4 << 20;

// t = latency + x / bandwidth by least squares on relative residuals (weights 1/t^2): plain least
// squares on seconds is decided by the 4 MiB message alone and leaves the latency, which the small
// messages measure, to noise. The latency is clamped at 0 (the slope refitted through the origin).
Link fit_link(const std::vector<double>& x, const std::vector<double>& t) {
  double sw = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (t[i] * t[i]);
    sw += w;
    sx += w * x[i];
    sxx += w * x[i] * x[i];
    st += w * t[i];
    sxt += w * x[i] * t[i];
  }
  const double det = sw * sxx - sx * sx;
  double slope = (sw * sxt - sx * st) / det, intercept = (sxx * st - sx * sxt) / det;
  if (!(intercept >= 0)) {
    intercept = 0;
    slope = sxt / sxx;
  }
  // Times that do not grow with size (noise on a tiny range): the largest message's mean rate.
  if (!(slope > 0)) slope = t.back() / x.back();
  return {1.0 / slope, intercept};
}

// Seconds per call of `op`, median of `repeats` samples after a warm-up, the ranks starting each
// sample together. Small messages repeat back to back within a sample (as a training step issues
// them) so that the barrier and the clock do not dominate them.
template <typename Op>
double time_op(comm::Communicator& world, size_t bytes, int repeats, Op op) {
  const int calls = static_cast<int>(std::max<size_t>(1, (64 << 10) / bytes));
  std::vector<double> samples;
  for (int r = 0; r <= repeats; ++r) {
    world.barrier()->wait();
    const auto t0 = Clock::now();
    for (int c = 0; c < calls; ++c) op();
    if (r > 0) samples.push_back(seconds_since(t0) / calls);
  }
  return median(samples);
}

// Seconds of `op` as a training step meets it: every rank first computes (`work`, the same on each),
// then issues it; the time from the issue to the result includes waiting for the other ranks to
// finish their work and for the communicator's threads to get a core the ranks compute on. Median of
// `repeats`, one call per sample.
template <typename Work, typename Op>
double time_op_busy(comm::Communicator& world, int repeats, Work work, Op op) {
  std::vector<double> samples;
  for (int r = 0; r <= repeats; ++r) {
    world.barrier()->wait();
    work();
    const auto t0 = Clock::now();
    op();
    if (r > 0) samples.push_back(seconds_since(t0));
  }
  return median(samples);
}

struct LinkResult {
  Link all_reduce, p2p;
  Link busy;  // all-reduce between computing ranks
  std::vector<double> busy_s;
  std::vector<double> all_reduce_s, p2p_s;  // measured, per size from kMinBytes by 4
  bool measured = false;
};

// "1K 52us 4K 60us ..." against the fit: how well the two-parameter model holds.
std::string describe_times(const std::vector<double>& seconds) {
  std::string s;
  size_t bytes = kMinBytes;
  for (double t : seconds) {
    s += fmt::format("{}{}{} {:.0f}us", s.empty() ? "" : ", ", bytes >= (1 << 20) ? bytes >> 20 : bytes >> 10,
                     bytes >= (1 << 20) ? "M" : "K", 1e6 * t);
    bytes *= 4;
  }
  return s;
}

// At least this many samples per size: the ranks' communication threads share the cores with the
// ranks, and with 5 samples the 4 MiB all-reduce's median still swings between 2 and 5 ms here (the
// whole sweep costs well under a second).
constexpr int kLinkSamples = 15;

LinkResult measure_link(comm::Communicator& world, int repeats_flag) {
  const int repeats = std::max(repeats_flag, kLinkSamples);
  LinkResult out;
  const int n = world.size(), rank = world.rank();
  if (n == 1) return out;
  std::vector<float> buf(kMaxBytes / sizeof(float), 0.0f);  // zeros: sums stay finite however often repeated
  std::vector<double> ring_x, ring_t, p2p_x, p2p_t;
  for (size_t bytes = kMinBytes; bytes <= kMaxBytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    const double t = time_op(world, bytes, repeats, [&] {
      world.all_reduce(buf.data(), count, DType::kFloat32, comm::ReduceOp::kSum)->wait();
    });
    ring_x.push_back(2.0 * (n - 1) / n * static_cast<double>(bytes));
    ring_t.push_back(t);
    // Ping-pong between ranks 0 and 1, half the round trip; the other ranks only join the barriers.
    const double rtt = time_op(world, bytes, repeats, [&] {
      if (rank == 0) {
        world.send(buf.data(), count, DType::kFloat32, 1)->wait();
        world.recv(buf.data(), count, DType::kFloat32, 1)->wait();
      } else if (rank == 1) {
        world.recv(buf.data(), count, DType::kFloat32, 0)->wait();
        world.send(buf.data(), count, DType::kFloat32, 0)->wait();
      }
    });
    p2p_x.push_back(static_cast<double>(bytes));
    p2p_t.push_back(rtt / 2);
  }
  ring_t = mean_over_ranks(world, ring_t);
  // The same all-reduces between computing ranks: a few milliseconds of the model's kind of work
  // (float products) before each.
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(192, 192);
  Eigen::MatrixXf prod(192, 192);
  auto work = [&] {
    for (int k = 0; k < 8; ++k) prod.noalias() = a * a;
  };
  std::vector<double> busy_t;
  for (size_t bytes = kMinBytes; bytes <= kMaxBytes; bytes *= 4) {
    busy_t.push_back(time_op_busy(world, repeats, work, [&] {
      world.all_reduce(buf.data(), bytes / sizeof(float), DType::kFloat32, comm::ReduceOp::kSum)->wait();
    }));
  }
  busy_t = mean_over_ranks(world, busy_t);
  out.busy_s = busy_t;
  out.busy = fit_link(ring_x, busy_t);
  out.busy.latency /= 2.0 * (n - 1);
  out.all_reduce_s = ring_t;
  out.p2p_s = p2p_t;
  out.all_reduce = fit_link(ring_x, ring_t);
  // The ring model's 2(n-1) messages per all-reduce: the intercept is that many latencies.
  out.all_reduce.latency /= 2.0 * (n - 1);
  out.p2p = fit_link(p2p_x, p2p_t);  // rank 0's, which prints it
  out.measured = true;
  return out;
}

// A collective over one rank copies its payload into its output: what ZeRO-3 over one data-parallel
// rank pays at every gather to fill its window. All-gathers of kMinBytes..kMaxBytes, every rank at
// once on a group of its own (measured at every world size), the mean over ranks, fitted as a link.
struct CopyResult {
  Link copy;
  std::vector<double> seconds;  // per size from kMinBytes by 4
};

CopyResult measure_copy(comm::Communicator& world, int repeats_flag) {
  const int repeats = std::max(repeats_flag, kLinkSamples);
  const std::unique_ptr<comm::Communicator> alone = world.split(world.rank(), 0);
  std::vector<float> buf(kMaxBytes / sizeof(float), 0.0f), gathered(kMaxBytes / sizeof(float));
  CopyResult out;
  std::vector<double> x;
  for (size_t bytes = kMinBytes; bytes <= kMaxBytes; bytes *= 4) {
    out.seconds.push_back(time_op(world, bytes, repeats, [&] {
      alone->all_gather(buf.data(), gathered.data(), bytes / sizeof(float), DType::kFloat32)->wait();
    }));
    x.push_back(static_cast<double>(bytes));
  }
  out.seconds = mean_over_ranks(world, out.seconds);
  out.copy = fit_link(x, out.seconds);
  return out;
}

// The wait for the slowest rank at a collective the ranks' compute waits on (SyncWait):
// every rank runs segments of the same compute (float products, the model's kind), once with a
// 4-byte all-reduce after each segment and once with none between, taking turns over kSyncRounds
// rounds. Per segment, the difference of the totals less the link's own time for that all-reduce is
// the mean wait. The mean, not a median: the wait is mostly short but now and then a scheduler slice
// (a communication thread waiting for a core that a rank computes on), and a step pays every one, so
// each length runs segments for about kSyncSeconds for the rare long waits to average out. Five
// lengths, from a tenth of a millisecond (the compute between a pipeline's or a block's
// collectives) to tens of milliseconds (a step's), fitted to latency + fraction x segment.
struct SyncResult {
  SyncWait sync;
  std::vector<double> segment_s, wait_s;  // measured, per segment length
};

// wait = latency + fraction x segment by plain least squares on seconds: unlike the link's fit, not
// on relative residuals, since a short segment's wait is mostly noise and can come out at or below
// zero, and the long segments' waits are the ones a step meets. A negative latency is clamped at 0
// (the fraction refitted through the origin); the fraction is kept in [0, 1), the cluster file's
// range.
SyncWait fit_sync(const std::vector<double>& x, const std::vector<double>& t) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sxx = 0, st = 0, sxt = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sxx += x[i] * x[i];
    st += t[i];
    sxt += x[i] * t[i];
  }
  SyncWait s;
  s.fraction = (n * sxt - sx * st) / (n * sxx - sx * sx);
  s.latency = (st - s.fraction * sx) / n;
  if (!(s.latency >= 0)) {
    s.latency = 0;
    s.fraction = sxt / sxx;
  }
  s.fraction = std::clamp(s.fraction, 0.0, 0.99);
  return s;
}

constexpr double kSyncSeconds = 0.25;  // of segments per length and kind (alone, synchronized)
// Many short rounds rather than two long ones: the wait is a difference of two totals, and the
// machine's speed moving between a run and its twin by a few percent of the run is, at the longest
// segments, as much as the wait itself.
constexpr int kSyncRounds = 8;
constexpr int kSyncMinSegments = 6;  // per round

SyncResult measure_sync(comm::Communicator& world, const Link& link) {
  SyncResult out;
  const int n = world.size();
  if (n == 1) return out;
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(96, 96);
  Eigen::MatrixXf prod(96, 96);
  float word = 0.0f;
  auto segment = [&](int products) {
    for (int k = 0; k < products; ++k) prod.noalias() = a * a;
  };
  // One product's seconds (every rank at once, the mean over them, so that all run as many segments).
  segment(20);
  world.barrier()->wait();
  const auto t0 = Clock::now();
  segment(100);
  const double product = mean_over_ranks(world, {seconds_since(t0) / 100}).front();
  // The ring all-reduce's 2 (n - 1) messages of (almost) nothing: the link's part of each wait.
  const double link_time = 2.0 * (n - 1) * link.time(0.0);
  for (int products : {4, 16, 64, 256, 1024}) {
    const int segments = std::max(kSyncMinSegments, static_cast<int>(kSyncSeconds / kSyncRounds /
                                                                      (products * product + link_time)));
    double alone = 0, synced = 0;
    segment(products);  // warm
    for (int r = 0; r < kSyncRounds; ++r) {
      world.barrier()->wait();
      auto start = Clock::now();
      for (int k = 0; k < segments; ++k) segment(products);
      alone += seconds_since(start);
      world.barrier()->wait();
      start = Clock::now();
      for (int k = 0; k < segments; ++k) {
        segment(products);
        world.all_reduce(&word, 1, DType::kFloat32, comm::ReduceOp::kSum)->wait();
      }
      synced += seconds_since(start);
    }
    const std::vector<double> m = mean_over_ranks(world, {alone, synced});
    const double count = static_cast<double>(segments) * kSyncRounds;
    out.segment_s.push_back(m[0] / count);
    out.wait_s.push_back((m[1] - m[0]) / count - link_time);
  }
  out.sync = fit_sync(out.segment_s, out.wait_s);
  return out;
}

// The optimizer.

// Parameters per second of the engine's step (AdamW with the GPT's two groups, clipping at 1) on a
// 1-rank communicator, so that the update alone is timed, but on every rank at once (they share the
// memory bandwidth the update is bound by). The mean over the ranks.
// `offload`: the same at stage 1 with the optimizer offloaded (the master and state in the offload
// tier, the CPU optimizer in its pipeline with the copies): the whole offloaded update per parameter,
// which the planner takes as host_optimizer_rate (no separate host link: here the copies are
// host-to-host and inside that time).
double optimizer_rate(comm::Communicator& world, int repeats, bool offload) {
  const std::unique_ptr<comm::Communicator> alone = world.split(world.rank(), 0);
  EngineOptions opt = gpt2_engine_options(3e-4f);
  opt.stage = offload ? 1 : 0;
  opt.offload.optimizer = offload;
  Engine engine(*alone, opt);
  const size_t n = size_t{4} << 20;
  std::vector<float> w(n, 0.01f);
  const int id = engine.add_param({.name = "w", .shape = {static_cast<int64_t>(n)}, .dtype = DType::kFloat32,
                                   .data = {w.data(), n}, .unit = 0, .group = 0});
  engine.finalize();
  std::vector<double> samples;
  for (int r = 0; r <= std::max(repeats, 3); ++r) {
    {
      UnitScope s = engine.gather_for_backward(0);
      std::fill_n(s.grad_as<float>(id), n, 1e-4f);
    }
    engine.finish_backward();
    world.barrier()->wait();
    const auto t0 = Clock::now();
    engine.step();
    if (r > 0) samples.push_back(seconds_since(t0));
  }
  return mean_over_ranks(world, {static_cast<double>(n) / median(samples)})[0];
}

// The rest.

// Float FLOP/s of a 512^3 GEMM with Eigen (the model's products), median, every rank at once (the
// mean over ranks).
double gemm_flops(comm::Communicator& world, int repeats) {
  constexpr int N = 512;
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(N, N), b = Eigen::MatrixXf::Random(N, N);
  Eigen::MatrixXf c(N, N);
  std::vector<double> samples;
  for (int r = 0; r <= std::max(repeats, 3); ++r) {
    world.barrier()->wait();
    const auto t0 = Clock::now();
    c.noalias() = a * b;
    if (r > 0) samples.push_back(seconds_since(t0));
  }
  if (!std::isfinite(c(0, 0))) std::printf("note: the GEMM gave %g\n", static_cast<double>(c(0, 0)));  // keeps it alive
  return mean_over_ranks(world, {2.0 * N * N * N / median(samples)})[0];
}

// MemAvailable from /proc/meminfo, in bytes (0 when it cannot be read).
double mem_available() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {  // "MemAvailable:   12345678 kB" (some lines have no unit)
    if (line.rfind("MemAvailable:", 0) == 0) return 1024.0 * std::strtod(line.c_str() + 13, nullptr);
  }
  return 0;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

// With one rank there is no link to measure (and no layout of one rank communicates): a shared-memory
// guess of 10 GB/s and 10 us stands in.
constexpr Link kDefaultLink{1e10, 1e-5};

// This machine's cores (at least one): its devices, which the ranks share.
}  // namespace

int machine_cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }


void write_cluster(const std::string& path, const Cluster& cluster, const std::string& flag) {
  std::ofstream out(path, std::ios::binary);
  out << to_json(cluster);
  out.close();
  if (!out) ZERO_THROW(IoError, "{}: cannot write '{}'", flag, path);
}

MachineCalibration calibrate_machine(comm::Communicator& world, int repeats) {
  ZERO_CHECK(repeats >= 1, "calibrate_machine: repeats {} is not positive", repeats);
  MachineCalibration out;
  Cluster& cluster = out.cluster;
  const LinkResult link = measure_link(world, repeats);
  // The cluster has one link inside a node and one across; this machine is one node, so one fit is
  // both: the all-reduce between computing ranks, as a training step meets its collectives on cores
  // the ranks share (the idle fit is reported beside it).
  cluster.intra = link.measured ? link.busy : kDefaultLink;
  cluster.inter = cluster.intra;
  const CopyResult copy = measure_copy(world, repeats);
  cluster.copy = copy.copy;
  const SyncResult sync = measure_sync(world, cluster.intra);
  cluster.sync = sync.sync;
  cluster.optimizer_rate = optimizer_rate(world, repeats, false);
  cluster.host_optimizer_rate = optimizer_rate(world, repeats, true);
  cluster.peak_flops = gemm_flops(world, repeats);
  // On a CPU machine the devices are its cores, which the ranks share.
  const int cores = machine_cores();
  cluster.devices_per_node = cores;
  cluster.nodes = 1;
  cluster.shared_cores = true;
  cluster.device_memory = mem_available() / cores;
  if (!(cluster.device_memory > 0)) ZERO_THROW(IoError, "cannot read MemAvailable from /proc/meminfo");
  cluster.matmul_efficiency = 1;  // peak_flops is a measured GEMM's rate
  cluster.name = fmt::format("this machine ({} cores), calibrated {}", cores, today());

  std::string& s = out.summary;
  if (link.measured) {
    s += fmt::format("  link idle       all-reduce over {} ranks: latency {:.2f} us, bandwidth {:.3g} GB/s\n",
                     world.size(), 1e6 * link.all_reduce.latency, 1e-9 * link.all_reduce.bandwidth);
    s += fmt::format("                  measured {}\n", describe_times(link.all_reduce_s));
    s += fmt::format("  link in use     all-reduce between computing ranks: latency {:.2f} us, bandwidth {:.3g} GB/s\n",
                     1e6 * link.busy.latency, 1e-9 * link.busy.bandwidth);
    s += fmt::format("                  measured {}\n", describe_times(link.busy_s));
    s += fmt::format("  p2p (0 <-> 1)   latency {:.2f} us, bandwidth {:.3g} GB/s (one way, half the round trip)\n",
                     1e6 * link.p2p.latency, 1e-9 * link.p2p.bandwidth);
    s += fmt::format("                  measured {}\n", describe_times(link.p2p_s));
    std::string measured;
    for (size_t i = 0; i < sync.segment_s.size(); ++i) {
      measured += fmt::format("{}{:.2g} ms: {:.0f}us", i > 0 ? ", " : "", 1e3 * sync.segment_s[i], 1e6 * sync.wait_s[i]);
    }
    s += fmt::format("  sync wait       {:.2f} us per synchronization + {:.3f} of the compute between (the slowest rank)\n",
                     1e6 * cluster.sync.latency, cluster.sync.fraction);
    s += fmt::format("                  measured after segments of {}\n", measured);
  } else {
    s += fmt::format("  link            one rank: not measured, default latency {:.2f} us, bandwidth {:.3g} GB/s\n",
                     1e6 * kDefaultLink.latency, 1e-9 * kDefaultLink.bandwidth);
  }
  s += fmt::format("  optimizer_rate  {:.3g} parameters/s (offloaded: {:.3g})\n", cluster.optimizer_rate,
                   cluster.host_optimizer_rate);
  s += fmt::format("  copy            all-gather over one rank: latency {:.2f} us, bandwidth {:.3g} GB/s\n",
                   1e6 * copy.copy.latency, 1e-9 * copy.copy.bandwidth);
  s += fmt::format("                  measured {}\n", describe_times(copy.seconds));
  s += fmt::format("  peak_flops      {:.3g} FLOP/s (512^3 float GEMM, per rank)\n", cluster.peak_flops);
  s += fmt::format("  device_memory   {:.3g} GB per core x {} cores\n", 1e-9 * cluster.device_memory, cores);
  return out;
}

}  // namespace zero::strategy
