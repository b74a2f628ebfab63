// Measures this machine for the strategy planner and writes its cluster description
// (parallel/strategy/cluster.h), so that the planner's time predictions use the GPT's own kernels at
// the sizes its layouts use rather than a FLOP count at a guessed efficiency:
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/gpt/calibrate_gpt
//       --gpt 4,64,4,256,64 --batch 16 --world 4 --out cluster.json [--repeats 5] [--rounds 3] [--dtype fp32]
//
// --gpt L,C,H[,V,T] is the model (n_layer, n_embd, n_head, vocabulary, context), --batch the global
// batch the planner will be asked about, --world the largest world it will plan for. What it measures:
//   kernels         every (micro-batch size, tp, sequence parallelism) that a layout of 1..--world
//                   ranks runs (strategy::enumerate_layouts), each of the three parts (one block, the
//                   embeddings, the head with the loss) x three passes (forward, the backward's input
//                   part, its weight part), timed on every rank at once, median of --repeats after a
//                   warm-up, mean over the ranks, under strategy::kernel_key; at tp 1 also by one
//                   rank alone, the others idle (strategy::alone_key: what a one-rank run meets);
//                   where the ranks hold whole tp groups, also on a real group with its collectives,
//                   the passes back to back as a step runs them and their mean (at least 30 repeats);
//                   the whole set --rounds times, one round after another, the median round kept;
//   intra / inter   the ring model fitted to all-reduces over the launched ranks (1 KiB .. 4 MiB);
//                   point-to-point between ranks 0 and 1 is fitted and printed beside it;
//   sync            the wait for the slowest rank at a collective after compute (measure_sync);
//   optimizer_rate  parameters per second of the engine's AdamW step on one rank (all ranks at once),
//                   and host_optimizer_rate the same with the optimizer offloaded;
//   copy            an all-gather over one rank (ZeRO-3 at dp 1 filling its window), fitted as a link;
//   the rest        cores as devices, MemAvailable per core, a float GEMM's rate as peak_flops.
// Rank 0 writes the JSON to --out and prints a summary.
//
// With --add-tp-parts FILE (launched on more ranks than the machine has cores) it only times the tp
// parts on real groups at that crowding and adds them to FILE (strategy::crowded_key).
#include <Eigen/Dense>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/check.h"
#include "base/dtype.h"
#include "base/error.h"
#include "comm/launch/process_group.h"
#include "comm/planning_communicator.h"
#include "tools/cli/flags.h"
#include "examples/heap.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_flags.h"
#include "examples/gpt/gpt_model.h"
#include "parallel/strategy/cluster.h"
#include "parallel/strategy/gpt2.h"
#include "parallel/strategy/kernel_times.h"
#include "parallel/strategy/predict.h"
#include "zero/engine.h"

namespace {

using namespace zero;
using examples::Gpt;
using examples::GptConfig;
using strategy::KernelLayer;
using strategy::KernelPass;
using examples::GptStage;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  ZERO_CHECK(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The mean over the ranks of each value (every rank passes the same number of them, in the same order).
std::vector<double> mean_over_ranks(comm::Communicator& world, std::vector<double> values) {
  if (!values.empty()) world.all_reduce(values.data(), values.size(), DType::kFloat64, comm::ReduceOp::kAvg)->wait();
  return values;
}

// ---------------------------------------------------------------------------------------------------
// 1. Kernels.

// What a layout runs per micro-batch, as far as the kernels' times go.
struct KernelShape {
  int batch = 1, tp = 1;
  bool sp = false;
  auto operator<=>(const KernelShape&) const = default;
};

// The distinct shapes over every layout of 1..world ranks: exactly the kernels the GPT's description (parallel/strategy/gpt2.h) will
// look up for them.
std::vector<KernelShape> kernel_shapes(const strategy::ModelCosts& costs, int world, int batch, bool print) {
  std::set<KernelShape> shapes;
  for (int n = 1; n <= world; ++n) {
    const std::vector<Layout> layouts = strategy::enumerate_layouts(costs, n, batch);
    if (layouts.empty() && print) std::printf("note: no layout of %d rank(s) runs a batch of %d\n", n, batch);
    for (const Layout& l : layouts) {
      shapes.insert({batch / (l.dp * l.micro_batches), l.tp, l.sequence_parallel});
    }
  }
  return {shapes.begin(), shapes.end()};
}

// The part as the pipeline stage that holds only it: one middle block, an embedding-only first stage
// or a head-only last stage (so that each is timed alone and a stage's time is their sum).
GptStage stage_of(KernelLayer part, int n_layer) {
  switch (part) {
    case KernelLayer::kBlock: return {0, 1, false, false};
    case KernelLayer::kEmbedding: return {0, 0, true, false};
    case KernelLayer::kHead: return {n_layer, n_layer, false, true};
  }
  return {};
}

// One part of the model at one shape, with random inputs and zeroed gradient buffers, run pass by pass.
class PartRun {
 public:
  // Throws (the model's InvalidArgument) when the part cannot be built at this tp.
  // `group` (not null): a real tp group of s.tp ranks this rank is one of; its collectives are then
  // part of what is timed.
  PartRun(const Gpt& whole, KernelLayer part, const KernelShape& s, uint64_t seed, comm::Communicator* group = nullptr)
      : stage_(stage_of(part, whole.config().n_layer)),
        // It does no communication, so what is timed is the compute alone; the planner adds the
        // collectives from the link. Addressing everything makes its results those of identical ranks
        // (a sum times tp, an all-gather repeating this rank's part): the memory traffic of a real
        // collective's result without the wire.
        tp_(s.tp > 1 ? std::make_unique<comm::PlanningCommunicator>(
                           0, s.tp, [](const void*, size_t) { return true; }, memory::DeviceKind::kHost)
                     : nullptr),
        model_(whole, examples::GptParallel{group != nullptr ? group : tp_.get(), s.sp}, stage_),
        B_(s.batch),
        T_(whole.config().block_size) {
    for (const Gpt::Param& p : model_.params()) grads_.emplace_back(p.values.size(), 0.0f);
    access_.grad = [this](size_t i) { return grads_[i].data(); };
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> token(0, whole.config().vocab_size - 1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int i = 0; i < B_ * T_; ++i) {
      tokens_.push_back(token(rng));
      targets_.push_back(token(rng));
    }
    // A stage after the first reads the previous one's output; one before the last gets the next
    // one's input gradient: both this rank's rows of the residual stream.
    const size_t numel = model_.activation_numel(B_, T_);
    if (!stage_.first) input_.resize(numel);
    if (!stage_.last) grad_output_.resize(numel);
    for (float& x : input_) x = normal(rng);
    for (float& x : grad_output_) x = 0.01f * normal(rng);
  }

  void run(KernelPass pass) {
    switch (pass) {
      case KernelPass::kForward:
        model_.forward_micro_batch(0, tokens_, targets_, B_, T_, stage_.first ? nullptr : input_.data(), &output_,
                                   access_);
        break;
      case KernelPass::kInput:
        model_.backward_micro_batch(0, 1.0f, stage_.last ? nullptr : grad_output_.data(), &grad_input_, false, access_);
        break;
      case KernelPass::kWeight: model_.weight_micro_batch(0, access_); break;
    }
  }

 private:
  GptStage stage_;
  std::unique_ptr<comm::PlanningCommunicator> tp_;
  Gpt model_;
  int B_, T_;
  std::vector<std::vector<float>> grads_;
  Gpt::Access access_;
  std::vector<int> tokens_, targets_;
  std::vector<float> input_, grad_output_, output_, grad_input_;
};

constexpr KernelPass kPasses[] = {KernelPass::kForward, KernelPass::kInput, KernelPass::kWeight};
// Repeats of a part on a real tp group at least: its mean carries the collectives' rare long waits.
constexpr int kTpSamples = 30;

// The median seconds of the part's three passes over `repeats` runs after a warm-up, `before` called
// before each pass.
template <typename Before>
std::vector<double> pass_medians(PartRun& part, int repeats, Before before) {
  std::vector<std::vector<double>> samples(3);
  for (int r = 0; r <= repeats; ++r) {  // r 0 warms up (allocations, caches)
    for (size_t p = 0; p < 3; ++p) {
      before();
      const auto t0 = Clock::now();
      part.run(kPasses[p]);
      if (r > 0) samples[p].push_back(since(t0));
    }
  }
  return {median(samples[0]), median(samples[1]), median(samples[2])};
}

// This rank's median seconds of the part's three passes, every rank running the same kernel at the
// same moment (a barrier before each): a real run of that many ranks computes concurrently, so the
// contention for cores and memory bandwidth is part of the measurement.
std::vector<double> time_part(PartRun& part, int repeats, comm::Communicator& world) {
  return pass_medians(part, repeats, [&] { world.barrier()->wait(); });
}

// A part whose passes hold collectives (a tp group's), timed as a step runs it: the three passes back
// to back `repeats` times after a warm-up, with one barrier before them all (none between, so the
// ranks drift apart as in a run and each collective waits for the later one), and each pass's mean
// seconds. The mean, not the median: a collective between ranks that share the cores usually
// completes within a link latency but now and then waits a scheduler slice for a core (more often
// the more compute lies between collectives; docs/strategy.md), and a step pays every such wait,
// where a median over repeats leaves them out.
std::vector<double> time_part_in_sequence(PartRun& part, int repeats, comm::Communicator& world) {
  for (KernelPass pass : kPasses) part.run(pass);  // warm-up (allocations, caches)
  world.barrier()->wait();
  std::vector<double> sums(3, 0.0);
  for (int r = 0; r < repeats; ++r) {
    for (size_t p = 0; p < 3; ++p) {
      const auto t0 = Clock::now();
      part.run(kPasses[p]);
      sums[p] += since(t0);
    }
  }
  for (double& t : sums) t /= repeats;
  return sums;
}

// The same, run by rank 0 alone while the others wait in a collective (their cores idle): what a
// one-rank run meets on a machine whose ranks share the cores. Rank 0's medians, on every rank.
std::vector<double> time_part_alone(PartRun& part, int repeats, comm::Communicator& world) {
  std::vector<double> t(3, 0.0);
  if (world.rank() == 0) t = pass_medians(part, repeats, [] {});
  world.all_reduce(t.data(), t.size(), DType::kFloat64, comm::ReduceOp::kSum)->wait();
  return t;
}

// Every kernel the planner looks up for layouts of 1..world ranks, in seconds by kernel key; rank 0
// prints each shape's times where `verbose`. `crowded`: only the parts on real tp groups, under
// strategy::crowded_key for the launched ranks (more than the machine's cores).
std::map<std::string, double> time_kernels(const GptConfig& cfg, DType dtype, int world_max, int batch, int repeats,
                                           comm::Communicator& world, bool verbose, bool crowded) {
  const bool print = verbose && world.rank() == 0;
  const strategy::DescribedModel costs(strategy::describe_gpt2(examples::gpt2_shape(cfg)), dtype);
  std::vector<KernelShape> shapes = kernel_shapes(costs, world_max, batch, print);
  // The keys the description's costs look its kernels up by.
  auto kernel = [&](KernelLayer part, KernelPass pass, const KernelShape& s) {
    return strategy::Kernel{costs.description().kernels, part, pass, s.batch, s.tp, s.sp};
  };
  if (crowded) std::erase_if(shapes, [&](const KernelShape& s) { return s.tp == 1 || world.size() % s.tp != 0; });
  if (shapes.empty()) ZERO_THROW(InvalidArgument, "--batch {}: no layout of 1..{} ranks runs it", batch, world_max);
  if (print) {
    std::printf("kernels: %zu shapes (micro-batch, tp, sp) x 3 parts x 3 passes, %d repeat(s) on %d rank(s) at once\n",
                shapes.size(), repeats, world.size());
  }
  const Gpt whole(cfg, 1);
  std::map<int, std::unique_ptr<comm::Communicator>> groups;  // real tp groups, by size
  std::vector<std::string> keys;
  std::vector<double> times;
  for (const KernelShape& s : shapes) {
    std::string line = fmt::format("  b {:>3} tp {} sp {}:", s.batch, s.tp, s.sp ? 1 : 0);
    for (KernelLayer part : {KernelLayer::kBlock, KernelLayer::kEmbedding, KernelLayer::kHead}) {
      // Every rank builds the same thing, so every rank skips the same parts and the barriers match.
      std::optional<PartRun> run;
      try {
        run.emplace(whole, part, s, 7);
      } catch (const Error& e) {
        if (print) std::printf("note: %s at b %d tp %d sp %d skipped: %s\n", strategy::kernel_layer_name(part), s.batch, s.tp, s.sp, e.what());
        continue;
      }
      line += fmt::format("  {}", strategy::kernel_layer_name(part));
      if (!crowded) {
        const std::vector<double> t = time_part(*run, repeats, world);
        line += fmt::format(" {:.3g}/{:.3g}/{:.3g} ms", 1e3 * t[0], 1e3 * t[1], 1e3 * t[2]);
        for (size_t p = 0; p < 3; ++p) {
          keys.push_back(strategy::kernel_key(kernel(part, kPasses[p], s)));
          times.push_back(t[p]);
        }
      }
      // The shapes a one-rank layout runs (tp 1), timed alone too when other ranks share the cores.
      if (s.tp == 1 && !s.sp && world.size() > 1 && !crowded) {
        const std::vector<double> u = time_part_alone(*run, repeats, world);
        line += fmt::format(" [{:.3g}/{:.3g}/{:.3g} alone]", 1e3 * u[0], 1e3 * u[1], 1e3 * u[2]);
        for (size_t p = 0; p < 3; ++p) {
          keys.push_back(strategy::alone_key(kernel(part, kPasses[p], s)));
          times.push_back(u[p]);
        }
      }
      // Where the launched ranks hold whole tp groups: the same part on a real group, its
      // collectives included as a run meets them (the ranks' waits for each other, the
      // communicator's threads competing for the cores), which the link's fit alone misses.
      if (s.tp > 1 && world.size() % s.tp == 0) {
        auto& group = groups[s.tp];
        if (!group) group = world.split(world.rank() / s.tp, world.rank() % s.tp);
        PartRun real(whole, part, s, 7, group.get());
        const std::vector<double> u = time_part_in_sequence(real, std::max(repeats, kTpSamples), world);
        line += fmt::format(" [{:.3g}/{:.3g}/{:.3g} with tp]", 1e3 * u[0], 1e3 * u[1], 1e3 * u[2]);
        for (size_t p = 0; p < 3; ++p) {
          keys.push_back(crowded ? strategy::crowded_key(kernel(part, kPasses[p], s), world.size())
                                 : strategy::with_collectives_key(kernel(part, kPasses[p], s)));
          times.push_back(u[p]);
        }
      }
    }
    if (print) {
      std::printf("%s (this rank's f/b/w)\n", line.c_str());
      std::fflush(stdout);
    }
  }
  times = mean_over_ranks(world, times);
  std::map<std::string, double> out;
  // The cluster file requires positive times; a pass below the clock's resolution counts as 1 ns.
  for (size_t i = 0; i < keys.size(); ++i) out[keys[i]] = std::max(times[i], 1e-9);
  return out;
}

// The kernels timed in `rounds` rounds, one after another, each kernel's median over the rounds.
// This machine's speed moves from one second to the next, so a kernel timed once carries the moment
// it was timed in; a slow moment now moves one round's time, not the median. Rank 0 prints the first
// round's times and how far the rounds fell apart.
std::map<std::string, double> time_kernel_rounds(const GptConfig& cfg, DType dtype, int world_max, int batch,
                                                 int repeats, int rounds, comm::Communicator& world, bool crowded) {
  std::vector<std::map<std::string, double>> per_round;
  for (int r = 0; r < rounds; ++r) {
    per_round.push_back(time_kernels(cfg, dtype, world_max, batch, repeats, world, r == 0, crowded));
  }
  std::map<std::string, double> out;
  std::vector<double> spreads;  // per kernel: slowest round over fastest, less 1
  for (const auto& [key, first] : per_round.front()) {
    std::vector<double> t;
    for (const auto& round : per_round) t.push_back(round.at(key));
    out[key] = median(t);
    spreads.push_back(*std::max_element(t.begin(), t.end()) / *std::min_element(t.begin(), t.end()) - 1);
  }
  if (world.rank() == 0 && rounds > 1) {
    std::printf("kernels: the median of %d rounds (above: the first); the rounds of a kernel fell %.0f%% apart at the "
                "median kernel, %.0f%% at most\n",
                rounds, 100 * median(spreads), 100 * *std::max_element(spreads.begin(), spreads.end()));
    std::fflush(stdout);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// 2. The link.

constexpr size_t kMinBytes = 1 << 10, kMaxBytes = 4 << 20;

// t = latency + x / bandwidth by least squares on relative residuals (weights 1/t^2): plain least
// squares on seconds is decided by the 4 MiB message alone and leaves the latency, which the small
// messages measure, to noise. The latency is clamped at 0 (the slope refitted through the origin).
strategy::Link fit_link(const std::vector<double>& x, const std::vector<double>& t) {
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
    if (r > 0) samples.push_back(since(t0) / calls);
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
    if (r > 0) samples.push_back(since(t0));
  }
  return median(samples);
}

struct LinkResult {
  strategy::Link all_reduce, p2p;
  strategy::Link busy;  // all-reduce between computing ranks
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
  strategy::Link copy;
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

// The wait for the slowest rank at a collective the ranks' compute waits on (strategy::SyncWait):
// every rank runs segments of the same compute (float products, the model's kind), once with a
// 4-byte all-reduce after each segment and once with none between, taking turns over kSyncRounds
// rounds. Per segment, the difference of the totals less the link's own time for that all-reduce is
// the mean wait. The mean, not a median: the wait is mostly short but now and then a scheduler slice
// (a communication thread waiting for a core that a rank computes on), and a step pays every one, so
// each length runs segments for about kSyncSeconds for the rare long waits to average out. Five
// lengths, from a tenth of a millisecond (the compute between a pipeline's or a block's
// collectives) to tens of milliseconds (a step's), fitted to latency + fraction x segment.
struct SyncResult {
  strategy::SyncWait sync;
  std::vector<double> segment_s, wait_s;  // measured, per segment length
};

// wait = latency + fraction x segment by plain least squares on seconds: unlike the link's fit, not
// on relative residuals, since a short segment's wait is mostly noise and can come out at or below
// zero, and the long segments' waits are the ones a step meets. A negative latency is clamped at 0
// (the fraction refitted through the origin); the fraction is kept in [0, 1), the cluster file's
// range.
strategy::SyncWait fit_sync(const std::vector<double>& x, const std::vector<double>& t) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sxx = 0, st = 0, sxt = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sxx += x[i] * x[i];
    st += t[i];
    sxt += x[i] * t[i];
  }
  strategy::SyncWait s;
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

SyncResult measure_sync(comm::Communicator& world, const strategy::Link& link) {
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
  const double product = mean_over_ranks(world, {since(t0) / 100}).front();
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
      alone += since(start);
      world.barrier()->wait();
      start = Clock::now();
      for (int k = 0; k < segments; ++k) {
        segment(products);
        world.all_reduce(&word, 1, DType::kFloat32, comm::ReduceOp::kSum)->wait();
      }
      synced += since(start);
    }
    const std::vector<double> m = mean_over_ranks(world, {alone, synced});
    const double count = static_cast<double>(segments) * kSyncRounds;
    out.segment_s.push_back(m[0] / count);
    out.wait_s.push_back((m[1] - m[0]) / count - link_time);
  }
  out.sync = fit_sync(out.segment_s, out.wait_s);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// 3. The optimizer.

// Parameters per second of the engine's step (AdamW with the GPT's two groups, clipping at 1) on a
// 1-rank communicator, so that the update alone is timed, but on every rank at once (they share the
// memory bandwidth the update is bound by). The mean over the ranks.
// `offload`: the same at stage 1 with the optimizer offloaded (the master and state in the offload
// tier, the CPU optimizer in its pipeline with the copies): the whole offloaded update per parameter,
// which the planner takes as host_optimizer_rate (no separate host link: here the copies are
// host-to-host and inside that time).
double optimizer_rate(comm::Communicator& world, int repeats, bool offload) {
  const std::unique_ptr<comm::Communicator> alone = world.split(world.rank(), 0);
  EngineOptions opt = strategy::gpt2_engine_options(3e-4f);
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
    if (r > 0) samples.push_back(since(t0));
  }
  return mean_over_ranks(world, {static_cast<double>(n) / median(samples)})[0];
}

// ---------------------------------------------------------------------------------------------------
// 4. The rest.

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
    if (r > 0) samples.push_back(since(t0));
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
constexpr strategy::Link kDefaultLink{1e10, 1e-5};

// This machine's cores (at least one): its devices, which the ranks share.
int machine_cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// The cluster as JSON to `path` (rank 0's job); `flag` names where the path came from.
void write_cluster(const std::string& path, const strategy::Cluster& cluster, const std::string& flag) {
  std::ofstream out(path, std::ios::binary);
  out << strategy::to_json(cluster);
  out.close();
  if (!out) ZERO_THROW(IoError, "{}: cannot write '{}'", flag, path);
}

// --add-tp-parts FILE: the tp parts on real groups, timed by the launched ranks (more than the
// machine's cores: two tp groups of 2 on 2 cores, a tp group of 4), added to the cluster FILE that a
// calibration on one rank per core wrote. A layout with more ranks than cores meets its tp
// collectives' waits at that crowding, which scaling the one-rank-per-core times does not give.
void add_crowded_tp_parts(const std::string& path, const GptConfig& cfg, DType dtype, int world_max, int batch,
                          int repeats, int rounds, comm::Communicator& world) {
  strategy::Cluster cluster = strategy::load_cluster(path);  // every rank: a bad file fails them all here
  const int cores = machine_cores();
  if (!cluster.shared_cores || cluster.devices() != cores) {
    ZERO_THROW(InvalidArgument, "--add-tp-parts '{}': not this machine's calibration (shared_cores {}, {} devices; "
               "this machine has {} cores)", path, cluster.shared_cores, cluster.devices(), cores);
  }
  if (world.size() <= cores) {
    ZERO_THROW(InvalidArgument, "--add-tp-parts: {} rank(s) launched, not more than the {} cores (with one rank per "
               "core the calibration itself times the tp parts)", world.size(), cores);
  }
  const auto t0 = Clock::now();
  const std::map<std::string, double> parts =
      time_kernel_rounds(cfg, dtype, world_max, batch, repeats, rounds, world, /*crowded=*/true);
  for (const auto& [key, seconds] : parts) cluster.kernels[key] = seconds;
  if (world.rank() == 0) {
    write_cluster(path, cluster, "--add-tp-parts");
    std::printf("added %zu tp part times on %d ranks to %s (%.1f s)\n", parts.size(), world.size(), path.c_str(),
                since(t0));
    std::fflush(stdout);
  }
  world.barrier()->wait();
}

int run(int argc, char** argv) {
  examples::keep_freed_memory();
  cli::Flags flags(argc, argv);
  const GptConfig cfg = examples::gpt_config_of_shape(flags.get("gpt", "2,64,4,256,64"));  // train_gpt's default model
  const int batch = flags.get_int("batch", 16);
  const int world_flag = flags.get_int("world", 0);  // 0: the launched ranks
  const int repeats = flags.get_int("repeats", 5);
  const int rounds = flags.get_int("rounds", 3);
  const std::string out_path = flags.get("out", "cluster.json");
  const std::string dtype_flag = flags.get("dtype", "fp32");
  const std::string add_to = flags.get("add-tp-parts", "");
  flags.check_all_used();
  if (batch < 1) ZERO_THROW(InvalidArgument, "--batch {} is not positive", batch);
  if (world_flag < 0) ZERO_THROW(InvalidArgument, "--world {} is negative", world_flag);
  if (repeats < 1) ZERO_THROW(InvalidArgument, "--repeats {} is not positive", repeats);
  if (rounds < 1) ZERO_THROW(InvalidArgument, "--rounds {} is not positive", rounds);
  if (out_path.empty()) ZERO_THROW(InvalidArgument, "--out is empty");
  if (dtype_flag != "fp32" && dtype_flag != "bf16") {
    ZERO_THROW(InvalidArgument, "--dtype '{}': the GPT runs in fp32 or bf16", dtype_flag);
  }
  const DType dtype = parse_dtype(dtype_flag);

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& world = *pg.host;
  const int rank = world.rank();
  const int world_max = world_flag > 0 ? world_flag : world.size();
  if (!add_to.empty()) {
    add_crowded_tp_parts(add_to, cfg, dtype, world_max, batch, repeats, rounds, world);
    return 0;
  }
  const auto t0 = Clock::now();
  if (rank == 0) {
    std::printf("calibrating for %s, batch %d, worlds 1..%d, on %d rank(s)\n", strategy::describe_gpt2(examples::gpt2_shape(cfg)).name.c_str(),
                batch, world_max, world.size());
    std::fflush(stdout);
  }

  strategy::Cluster cluster;
  cluster.kernels = time_kernel_rounds(cfg, dtype, world_max, batch, repeats, rounds, world, /*crowded=*/false);
  const LinkResult link = measure_link(world, repeats);
  // The cluster has one link inside a node and one across; this machine is one node, so one fit is
  // both: the all-reduce between computing ranks, as a training step meets its collectives on cores
  // the ranks share (the idle fit is printed beside it).
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
  cluster.matmul_efficiency = 1;  // the kernels are measured; peak_flops only prices what they miss
  cluster.name = fmt::format("this machine ({} cores), calibrated {}", cores, today());

  if (rank == 0) {
    write_cluster(out_path, cluster, "--out");
    std::printf("wrote %s: %s\n", out_path.c_str(), cluster.name.c_str());
    std::printf("  kernels         %zu\n", cluster.kernels.size());
    if (link.measured) {
      std::printf("  link idle       all-reduce over %d ranks: latency %.2f us, bandwidth %.3g GB/s\n",
                  world.size(), 1e6 * link.all_reduce.latency, 1e-9 * link.all_reduce.bandwidth);
      std::printf("                  measured %s\n", describe_times(link.all_reduce_s).c_str());
      std::printf("  link in use     all-reduce between computing ranks: latency %.2f us, bandwidth %.3g GB/s\n",
                  1e6 * link.busy.latency, 1e-9 * link.busy.bandwidth);
      std::printf("                  measured %s\n", describe_times(link.busy_s).c_str());
      std::printf("  p2p (0 <-> 1)   latency %.2f us, bandwidth %.3g GB/s (one way, half the round trip)\n",
                  1e6 * link.p2p.latency, 1e-9 * link.p2p.bandwidth);
      std::printf("                  measured %s\n", describe_times(link.p2p_s).c_str());
    } else {
      std::printf("  link            one rank: not measured, default latency %.2f us, bandwidth %.3g GB/s\n",
                  1e6 * kDefaultLink.latency, 1e-9 * kDefaultLink.bandwidth);
    }
    if (link.measured) {
      std::string measured;
      for (size_t i = 0; i < sync.segment_s.size(); ++i) {
        measured += fmt::format("{}{:.2g} ms: {:.0f}us", i > 0 ? ", " : "", 1e3 * sync.segment_s[i], 1e6 * sync.wait_s[i]);
      }
      std::printf("  sync wait       %.2f us per synchronization + %.3f of the compute between (the slowest rank)\n",
                  1e6 * cluster.sync.latency, cluster.sync.fraction);
      std::printf("                  measured after segments of %s\n", measured.c_str());
    }
    std::printf("  optimizer_rate  %.3g parameters/s (offloaded: %.3g)\n", cluster.optimizer_rate,
                cluster.host_optimizer_rate);
    std::printf("  copy            all-gather over one rank: latency %.2f us, bandwidth %.3g GB/s\n",
                1e6 * copy.copy.latency, 1e-9 * copy.copy.bandwidth);
    std::printf("                  measured %s\n", describe_times(copy.seconds).c_str());
    std::printf("  peak_flops      %.3g FLOP/s (512^3 float GEMM, per rank)\n", cluster.peak_flops);
    std::printf("  device_memory   %.3g GB per core x %d cores\n", 1e-9 * cluster.device_memory, cores);
    std::printf("  took            %.1f s\n", since(t0));
    std::fflush(stdout);
  }
  world.barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("calibrate_gpt", run, argc, argv); }
