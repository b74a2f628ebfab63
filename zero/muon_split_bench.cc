// How the ranks of the shard group split Muon's orthogonalization (zero/matrix_exchange.h) of a
// GPT-2-shaped model's hidden matrices: the layout the engine builds for them (whole-tensor buckets,
// the engine's default bucket size; stage 3's one bucket per block), the matrices handed out by the
// exchange's rule, each rank's Newton-Schulz FLOPs, and the time the busiest rank spends against
// one rank doing all of them (each matrix shape timed here once, single-threaded as the engine runs
// it). The exchange hands out the whole step's matrices and waits once, for the busiest rank, so
// that rank's time is the step's critical path. Speed-up: one rank's time over it. Prints one
// table; no collective runs (a planning communicator stands for the group).
//
//   bazel run -c opt --config=native //zero:muon_split_bench -- [--layers L] [--n-embd C] [--worlds 1,2,4,8,64]
//
// (GPT-2 124M by default: 12 layers of n_embd 768. Only the blocks' tensors matter here; the
// embeddings are AdamW's in Moonlight's recipe.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "comm/planning_communicator.h"
#include "memory/meta_device.h"
#include "memory/tracker.h"
#include "base/check.h"
#include "optim/newton_schulz.h"
#include "tools/cli/flags.h"
#include "zero/engine_options.h"
#include "zero/matrix_exchange.h"
#include "zero/shard_layout.h"
#include "zero/shard_ownership.h"

namespace zero {
namespace {

struct Tensor {
  size_t rows, cols;  // cols 0: a vector of `rows` elements
  int unit;
  size_t numel() const { return cols == 0 ? rows : rows * cols; }
};

// A block's tensors in registration order (the example's GPT): ln_1, c_attn, c_proj, ln_2, c_fc,
// mlp.c_proj, each weight then bias.
std::vector<Tensor> hidden_tensors(int layers, size_t C) {
  std::vector<Tensor> t;
  for (int l = 0; l < layers; ++l) {
    t.insert(t.end(), {{C, 0, l}, {C, 0, l}, {3 * C, C, l}, {3 * C, 0, l}, {C, C, l}, {C, 0, l}, {C, 0, l}, {C, 0, l},
                       {4 * C, C, l}, {4 * C, 0, l}, {C, 4 * C, l}, {C, 0, l}});
  }
  return t;
}

// Seconds of one newton_schulz on a rows x cols matrix (the best of `repeats`).
double time_newton_schulz(size_t rows, size_t cols, int repeats) {
  std::vector<float> g(rows * cols);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 2654435761u) % 2003) / 1000.0f - 1.0f;
  std::vector<float> out(g.size());
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    optim::newton_schulz(g.data(), rows, cols, out.data());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

struct Split {
  double max_share = 0;     // the busiest rank's share of all FLOPs
  double busiest_s = 0;     // the busiest rank's Newton-Schulz seconds per step: the critical path
  double imbalance = 0;     // max / mean FLOPs
  size_t buckets = 0;       // buckets holding matrices
};

Split split_at(const std::vector<Tensor>& tensors, int world, bool unit_buckets,
               const std::map<std::pair<size_t, size_t>, double>& seconds) {
  std::vector<size_t> numels;
  std::vector<int> units;
  std::vector<bool> whole;
  for (const Tensor& t : tensors) {
    numels.push_back(t.numel());
    units.push_back(t.unit);
    whole.push_back(t.cols != 0);
  }
  ShardLayoutOptions o = EngineOptions{}.layout;
  o.whole_tensor_buckets = true;
  o.unit_buckets = unit_buckets;
  const ShardLayout layout(numels, world, o, units, {}, {}, whole);
  const ShardOwnership ownership = world == 1 ? ShardOwnership::replicated(layout) : ShardOwnership::sharded(layout, 0);
  memory::MemoryTracker tracker;
  std::unique_ptr<memory::MetaDevice> device = memory::make_meta_device(tracker);
  memory::MetaDevice* meta = device.get();
  comm::PlanningCommunicator group(0, world, [meta](const void* p, size_t n) { return meta->addressable(p, n); },
                                   memory::DeviceKind::kHost);
  std::vector<ExchangedMatrix> matrices;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].cols != 0) matrices.push_back({i, tensors[i].rows, tensors[i].cols, {}, {}});
  }
  const MatrixExchange exchange(layout, ownership, matrices, &group, *device, std::chrono::minutes(1));
  const std::vector<double>& flops = exchange.flops_per_rank();
  const double total = std::accumulate(flops.begin(), flops.end(), 0.0);
  Split s;
  s.max_share = *std::max_element(flops.begin(), flops.end()) / total;
  s.imbalance = s.max_share * static_cast<double>(flops.size());
  std::vector<double> busy(flops.size(), 0.0);
  for (const ExchangedMatrix& m : matrices) {
    busy[static_cast<size_t>(std::max(exchange.owner(m.tensor), 0))] += seconds.at({m.rows, m.cols});
  }
  s.busiest_s = *std::max_element(busy.begin(), busy.end());
  std::vector<bool> seen(layout.buckets().size(), false);
  for (const ExchangedMatrix& m : matrices) seen[layout.buckets_of_tensor(m.tensor).first] = true;
  s.buckets = static_cast<size_t>(std::count(seen.begin(), seen.end(), true));
  return s;
}

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const int layers = flags.get_int("layers", 12);
  const int n_embd = flags.get_int("n-embd", 768);
  std::vector<int> worlds;
  for (const int w : flags.get_count_list("worlds", "1,2,4,8,16,64")) worlds.push_back(w);
  flags.check_all_used();
  if (layers < 1 || n_embd < 1) ZERO_THROW(InvalidArgument, "--layers {} and --n-embd {} must be positive", layers, n_embd);
  const std::vector<Tensor> tensors = hidden_tensors(layers, static_cast<size_t>(n_embd));
  std::map<std::pair<size_t, size_t>, double> seconds;
  double all = 0, total_flops = 0;
  size_t count = 0;
  for (const Tensor& t : tensors) {
    if (t.cols == 0) continue;
    ++count;
    const auto key = std::pair{t.rows, t.cols};
    if (!seconds.count(key)) seconds[key] = time_newton_schulz(t.rows, t.cols, 3);
    all += seconds[key];
    total_flops += optim::newton_schulz_flops(t.rows, t.cols, 5);
  }
  std::printf("Muon's orthogonalization split over the shard group: a GPT-2-shaped model of %d layers, n_embd %d: %zu "
              "hidden matrices, %.1f GFLOP per step (5 Newton-Schulz steps), %.3f s on one rank\n",
              layers, n_embd, count,
              total_flops / 1e9, all);
  std::printf("| ranks | layout | buckets with matrices | busiest rank's FLOPs | ideal | max / mean | "
              "busiest rank: the critical path (s) | speed-up |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int world : worlds) {
    for (const bool unit_buckets : {false, true}) {
      if (world == 1 && unit_buckets) continue;
      const Split s = split_at(tensors, world, unit_buckets, seconds);
      std::printf("| %d | %s | %zu | %.1f%% | %.1f%% | %.2f | %.3f | %.2fx |\n", world,
                  world == 1 ? "one rank" : unit_buckets ? "stage 3 (a bucket per block)" : "stages 1-2",
                  s.buckets, 100 * s.max_share, 100.0 / world, s.imbalance, s.busiest_s, all / s.busiest_s);
    }
  }
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::cli::run_program("muon_split_bench", zero::run, argc, argv); }
