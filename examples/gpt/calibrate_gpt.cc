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
//   the machine     the link, the wait for the slowest rank, the optimizer's rate, the copy, the
//                   GEMM rate and the memory: parallel/strategy/calibrate.h (what
//                   tools/plan/calibrate_cluster measures alone, for a model without kernels).
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
#include "parallel/strategy/calibrate.h"
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
using strategy::mean_over_ranks;
using strategy::median;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return strategy::seconds_since(t0); }

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

// collectives' waits at that crowding, which scaling the one-rank-per-core times does not give.
void add_crowded_tp_parts(const std::string& path, const GptConfig& cfg, DType dtype, int world_max, int batch,
                          int repeats, int rounds, comm::Communicator& world) {
  strategy::Cluster cluster = strategy::load_cluster(path);  // every rank: a bad file fails them all here
  const int cores = strategy::machine_cores();
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
    strategy::write_cluster(path, cluster, "--add-tp-parts");
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

  strategy::MachineCalibration machine = strategy::calibrate_machine(world, repeats);
  strategy::Cluster& cluster = machine.cluster;
  cluster.kernels = time_kernel_rounds(cfg, dtype, world_max, batch, repeats, rounds, world, /*crowded=*/false);
  if (rank == 0) {
    strategy::write_cluster(out_path, cluster, "--out");
    std::printf("wrote %s: %s\n", out_path.c_str(), cluster.name.c_str());
    std::printf("  kernels         %zu\n%s", cluster.kernels.size(), machine.summary.c_str());
    std::printf("  took            %.1f s\n", since(t0));
    std::fflush(stdout);
  }
  world.barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("calibrate_gpt", run, argc, argv); }
