// How long a small collective takes between ranks that compute, call by call: the distribution a
// step pays, not only its middle. Every rank runs segments of the same compute (float products,
// --products each) and a 256-byte all-reduce after each, --calls times, and the same segments with
// nothing between; a row per segment length.
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/comm/benchmarks/collective_tail
//       [--calls 2000] [--products 0,1,4,16,64,256]
//
// Columns: products per segment, the segment's seconds alone, what a segment with its all-reduce
// added (the mean: (synchronized - alone) / calls), and the all-reduce's own times on rank 0:
// median, 90th and 99th percentile, the largest, the mean, and the share of calls over 1 ms. Where
// the mean stands far above the median, a sum over many calls (a step's) is not the median times
// their count: docs/strategy.md, "Collectives' long waits".
#include <Eigen/Dense>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/launch/dist_env.h"
#include "tools/cli/flags.h"

namespace {

using namespace zero;
using namespace zero::comm;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Settings {
  int calls = 2000;
  std::vector<int> products;
};

Settings read_settings(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  Settings s;
  s.calls = flags.get_int("calls", 2000);
  if (s.calls < 1) ZERO_THROW(InvalidArgument, "--calls {}: one call at least", s.calls);
  s.products = flags.get_count_list("products", "0,1,4,16,64,256");
  flags.check_all_used();
  return s;
}

double percentile(const std::vector<double>& sorted, double p) {
  return sorted[static_cast<size_t>(p * static_cast<double>(sorted.size() - 1))];
}

int run(int argc, char** argv) {
  const Settings flags = read_settings(argc, argv);
  const DistEnv env = read_dist_env();
  auto store = connect_store(env, std::chrono::seconds(120));
  GlooOptions options;
  options.timeout = std::chrono::seconds(120);
  const auto comm = make_gloo_communicator(store, env.rank, env.world_size, options);
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(96, 96);
  Eigen::MatrixXf prod(96, 96);
  auto segment = [&](int products) {
    for (int k = 0; k < products; ++k) prod.noalias() = a * a;
  };
  std::vector<float> buf(64, 1.0f);
  auto all_reduce = [&] { comm->all_reduce(buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum)->wait(); };
  if (env.rank == 0) {
    std::printf("# collective_tail: %d ranks, Gloo TCP, a 256-byte all-reduce after each segment of 96x96 float "
                "products, %d calls per row\n",
                env.world_size, flags.calls);
    std::printf("%8s %12s %12s %10s %10s %10s %10s %10s %8s\n", "products", "segment us", "added us", "p50 us",
                "p90 us", "p99 us", "max us", "mean us", ">1 ms");
  }
  for (int products : flags.products) {
    segment(products);
    all_reduce();  // warm
    comm->barrier()->wait();
    auto t0 = Clock::now();
    for (int i = 0; i < flags.calls; ++i) segment(products);
    const double alone = seconds_since(t0);
    comm->barrier()->wait();
    std::vector<double> calls;
    t0 = Clock::now();
    for (int i = 0; i < flags.calls; ++i) {
      segment(products);
      const auto c0 = Clock::now();
      all_reduce();
      calls.push_back(seconds_since(c0));
    }
    const double synced = seconds_since(t0);
    if (env.rank != 0) continue;
    double sum = 0;
    int long_ones = 0;
    for (double c : calls) {
      sum += c;
      long_ones += c > 1e-3;
    }
    std::sort(calls.begin(), calls.end());
    const double n = flags.calls;
    std::printf("%8d %12.1f %12.1f %10.1f %10.1f %10.1f %10.1f %10.1f %7.1f%%\n", products, 1e6 * alone / n,
                1e6 * (synced - alone) / n, 1e6 * percentile(calls, 0.5), 1e6 * percentile(calls, 0.9),
                1e6 * percentile(calls, 0.99), 1e6 * calls.back(), 1e6 * sum / n, 100.0 * long_ones / n);
  }
  comm->barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("collective_tail", run, argc, argv); }
