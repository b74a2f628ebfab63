// calibrate_gpt (and the machine alone, tools/plan/calibrate_cluster) on 2 ranks: it writes a cluster file the planner reads back, with every kernel the
// planner will look up for the layouts of 1 and 2 ranks (measured, positive), a measured link and
// optimizer rate and the wait for the slowest rank; a bad flag fails with a message naming it. With
// --add-tp-parts on more ranks than cores it adds the tp parts timed at that crowding to a file.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/dtype.h"
#include "parallel/strategy/cluster.h"
#include "parallel/strategy/gpt2.h"
#include "parallel/strategy/kernel_times.h"
#include "parallel/strategy/predict.h"
#include "testing/launch.h"

namespace zero {
namespace {

using strategy::Kernel;
using strategy::KernelLayer;
using strategy::KernelPass;

constexpr int kBatch = 4;

std::string tmp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// The model the calibrations below time (--gpt 2,32,2,64,16), as the planner costs it.
strategy::DescribedModel small_gpt() {
  return strategy::DescribedModel(strategy::describe_gpt2(strategy::parse_gpt2_shape("2,32,2,64,16")), DType::kFloat32);
}

// The key of one layer's pass at a layout of the small GPT.
Kernel kernel(KernelLayer layer, KernelPass pass, const Layout& l) {
  return {"gpt/2,32,2,64,16", layer, pass, kBatch / (l.dp * l.micro_batches), l.tp, l.sequence_parallel};
}

testing::LaunchResult calibrate(const std::vector<std::string>& extra, const std::string& out) {
  std::vector<std::string> args{"--gpt", "2,32,2,64,16", "--batch", std::to_string(kBatch), "--world", "2",
                                "--repeats", "1", "--rounds", "2", "--out", out};
  args.insert(args.end(), extra.begin(), extra.end());
  return testing::launch(2, "examples/gpt/calibrate_gpt", args);
}

}  // namespace

TEST_CASE("calibrate_gpt writes every kernel the planner looks up, a link and an optimizer rate") {
  const std::string out = tmp_path("c.json");
  const testing::LaunchResult r = calibrate({}, out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const strategy::Cluster c = strategy::load_cluster(out);
  CHECK(c.intra.bandwidth > 0);
  CHECK(c.intra.latency >= 0);
  CHECK(c.inter.bandwidth == c.intra.bandwidth);
  CHECK(c.optimizer_rate > 0);
  CHECK(c.peak_flops > 0);
  CHECK(c.shared_cores);
  // Each kernel's median over the rounds, and how far they fell apart.
  CHECK(r.output.find("kernels: the median of 2 rounds") != std::string::npos);
  // The wait for the slowest rank, measured and fitted (the parser keeps the fraction in [0, 1)).
  CHECK(r.output.find("sync wait") != std::string::npos);
  CHECK(c.sync.latency + c.sync.fraction > 0);
  const strategy::DescribedModel gpt = small_gpt();
  size_t looked_up = 0;
  for (int world : {1, 2}) {
    const std::vector<Layout> layouts = strategy::enumerate_layouts(gpt, world, kBatch);
    REQUIRE(!layouts.empty());
    for (const Layout& l : layouts) {
      for (KernelLayer part : {KernelLayer::kBlock, KernelLayer::kEmbedding, KernelLayer::kHead}) {
        for (KernelPass pass : {KernelPass::kForward, KernelPass::kInput, KernelPass::kWeight}) {
          auto timed = [&](const std::string& key) {
            CAPTURE(key);
            const auto it = c.kernels.find(key);
            REQUIRE(it != c.kernels.end());
            CHECK(it->second > 0);
            ++looked_up;
          };
          timed(strategy::kernel_key(kernel(part, pass, l)));
          // A one-rank layout's kernels are timed alone too (the other rank's core idle).
          if (world == 1) timed(strategy::alone_key(kernel(part, pass, l)));
        }
      }
    }
  }
  CHECK(looked_up > 0);
  // The planner runs on the file: a layout of 2 ranks gets a positive step time.
  strategy::PlanSettings settings;
  settings.engine.optimizer.groups.assign(2, {});
  settings.global_batch = kBatch;
  const strategy::Prediction p = strategy::predict(gpt, Layout{.dp = 2}, c, settings);
  CHECK(p.unsupported.empty());
  CHECK(p.time.step() > 0);
}

// tools/plan/calibrate_cluster: the machine without a model's kernels; the planner prices a model's
// compute on it from the FLOPs at the measured GEMM rate.
TEST_CASE("calibrate_cluster writes the machine's link, optimizer rate and GEMM rate, no kernels") {
  const std::string out = tmp_path("machine.json");
  const testing::LaunchResult r = testing::launch(2, "tools/plan/calibrate_cluster", {"--repeats", "1", "--out", out});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("no model's kernels") != std::string::npos);
  const strategy::Cluster c = strategy::load_cluster(out);
  CHECK(c.kernels.empty());
  CHECK(c.intra.bandwidth > 0);
  CHECK(c.optimizer_rate > 0);
  CHECK(c.host_optimizer_rate > 0);
  CHECK(c.peak_flops > 0);
  CHECK(c.matmul_efficiency == 1);
  CHECK(c.shared_cores);
  const strategy::DescribedModel gpt = small_gpt();
  strategy::PlanSettings settings;
  settings.engine.optimizer.groups.assign(2, {});
  settings.global_batch = kBatch;
  const strategy::Prediction p = strategy::predict(gpt, Layout{.dp = 2}, c, settings);
  CHECK(p.unsupported.empty());
  // Compute from FLOPs: the same layout on the same file with a block's forward calibrated differs.
  strategy::Cluster timed = c;
  timed.kernels[strategy::kernel_key(kernel(KernelLayer::kBlock, KernelPass::kForward, Layout{.dp = 2}))] = 1.0;
  CHECK(strategy::predict(gpt, Layout{.dp = 2}, timed, settings).time.step() > p.time.step());
  const testing::LaunchResult bad = testing::launch(2, "tools/plan/calibrate_cluster", {"--repeats", "0"});
  CHECK(bad.exit_code != 0);
  CHECK(bad.output.find("calibrate_cluster: --repeats 0 is not positive") != std::string::npos);
}

// The cores calibrate_gpt counts as this machine's devices.
int machine_cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// A cluster file as calibrate_gpt writes it on this machine (its cores as shared devices), with no
// kernels: what --add-tp-parts adds to.
strategy::Cluster this_machine(int devices) {
  strategy::Cluster c;
  c.name = "test";
  c.devices_per_node = devices;
  c.shared_cores = true;
  c.device_memory = 1e9;
  c.peak_flops = 1e10;
  c.intra = c.inter = {1e9, 1e-5};
  c.optimizer_rate = 1e8;
  c.kernels["kept"] = 1.0;
  return c;
}

void write(const std::string& path, const strategy::Cluster& c) {
  std::ofstream(path, std::ios::binary) << strategy::to_json(c);
}

testing::LaunchResult add_tp_parts(int ranks, const std::string& file) {
  return testing::launch(ranks, "examples/gpt/calibrate_gpt",
                         {"--gpt", "2,32,2,64,16", "--batch", std::to_string(kBatch), "--world", std::to_string(ranks),
                          "--repeats", "1", "--rounds", "1", "--add-tp-parts", file});
}

TEST_CASE("--add-tp-parts times the tp parts on more ranks than cores and adds them to the cluster file") {
  const int cores = machine_cores();
  const int ranks = cores + (cores % 2 == 0 ? 2 : 1);  // whole tp groups of 2
  if (ranks > 8) {
    MESSAGE("skipped: crowding " << cores << " cores takes " << ranks << " ranks");
    return;
  }
  const std::string file = tmp_path("crowded.json");
  write(file, this_machine(cores));
  const testing::LaunchResult r = add_tp_parts(ranks, file);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const strategy::Cluster c = strategy::load_cluster(file);
  CHECK(c.kernels.count("kept") == 1);  // what the file had stays
  const strategy::DescribedModel gpt = small_gpt();
  // Every part of every tp 2 layout of that many ranks, timed at that crowding (and nothing else).
  size_t added = 0;
  for (const Layout& l : strategy::enumerate_layouts(gpt, ranks, kBatch)) {
    if (l.tp != 2) continue;
    for (KernelLayer part : {KernelLayer::kBlock, KernelLayer::kEmbedding, KernelLayer::kHead}) {
      for (KernelPass pass : {KernelPass::kForward, KernelPass::kInput, KernelPass::kWeight}) {
        const std::string key = strategy::crowded_key(kernel(part, pass, l), ranks);
        CAPTURE(key);
        REQUIRE(c.kernels.count(key) == 1);
        CHECK(c.kernels.at(key) > 0);
        CHECK(c.kernels.count(strategy::kernel_key(kernel(part, pass, l))) == 0);
        ++added;
      }
    }
  }
  CHECK(added > 0);
}

TEST_CASE("--add-tp-parts refuses a launch that does not crowd the cores, and another machine's file") {
  const int cores = machine_cores();
  const std::string file = tmp_path("not_crowded.json");
  write(file, this_machine(cores));
  testing::LaunchResult r = add_tp_parts(1, file);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find(fmt::format("--add-tp-parts: 1 rank(s) launched, not more than the {} cores", cores)) !=
        std::string::npos);
  write(file, this_machine(cores + 1));
  r = add_tp_parts(1, file);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("--add-tp-parts '" + file + "': not this machine's calibration") != std::string::npos);
}

TEST_CASE("a bad flag fails and names the flag") {
  const std::string out = tmp_path("bad.json");
  struct Case {
    std::vector<std::string> extra;
    std::string named;
  };
  // The program's own message (zerorun does not echo the command line, so the flag's name there is
  // the error's).
  for (const Case& k : {Case{{"--batch", "0"}, "calibrate_gpt: --batch 0"}, Case{{"--bogus", "1"}, "unknown flag --bogus"},
                        Case{{"--gpt", "2,32"}, "calibrate_gpt: --gpt '2,32'"},
                        Case{{"--repeats", "0"}, "calibrate_gpt: --repeats 0"},
                        Case{{"--rounds", "0"}, "calibrate_gpt: --rounds 0"}}) {
    CAPTURE(k.named);
    testing::LaunchResult r = calibrate(k.extra, out);
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK(r.output.find(k.named) != std::string::npos);
  }
}

}  // namespace zero
