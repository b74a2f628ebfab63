// The engine against PyTorch (tests/data/pytorch/zero): stages 0, 1, 2 at world sizes 2 and 4, the
// 4-rank reference at 1 rank with 4 accumulated micro-steps (and 2 ranks x 2), no_sync accumulation,
// and deterministic mode bitwise equal across stages and world sizes; the same with the optimizer
// offloaded to the host tier.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "testing/launch.h"

namespace zero {
namespace {

const std::string kWorker = "tests/zero_reference_worker";
const std::string kData = "tests/data/pytorch/zero/";

void run_ok(int nproc, const std::vector<std::string>& args) {
  const testing::LaunchResult r = testing::launch(nproc, kWorker, args);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("match PyTorch") != std::string::npos);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// Runs the 4-rank reference in deterministic mode on `nproc` ranks at `stage` and returns its final
// parameters' bytes.
std::string deterministic_run(int nproc, const std::string& stage, const std::vector<std::string>& extra,
                              const std::string& tag) {
  std::string name = tag + "_" + std::to_string(nproc) + "_" + stage;
  for (const std::string& e : extra) name += e;
  const std::string dump = tmp(name + ".bin");
  std::vector<std::string> args{"--file", kData + "dp4_adamw_clip.json", "--stage", stage, "--deterministic",
                                "--dump", dump};
  args.insert(args.end(), extra.begin(), extra.end());
  run_ok(nproc, args);
  const std::string bytes = slurp(dump);
  REQUIRE(!bytes.empty());
  return bytes;
}

// Checks that every (ranks, stage) run's final parameters have the bits of the first.
void check_bitwise(const std::vector<std::pair<int, std::string>>& runs, const std::vector<std::string>& extra,
                   const std::string& tag) {
  std::string first;
  for (const auto& [nproc, stage] : runs) {
    CAPTURE(nproc);
    CAPTURE(stage);
    const std::string bytes = deterministic_run(nproc, stage, extra, tag);
    if (first.empty()) {
      first = bytes;
    } else {
      CHECK(bytes == first);
    }
  }
}

}  // namespace

TEST_CASE("2-rank reference at stages 0, 1, 2") {
  for (const char* stage : {"0", "1", "2"}) {
    CAPTURE(stage);
    run_ok(2, {"--file", kData + "dp2_adamw_clip.json", "--stage", stage});
  }
}

TEST_CASE("4-rank reference at stages 0, 1, 2") {
  for (const char* stage : {"0", "1", "2"}) {
    CAPTURE(stage);
    run_ok(4, {"--file", kData + "dp4_adamw_clip.json", "--stage", stage});
  }
}

TEST_CASE("4-rank reference on fewer ranks with accumulated micro-steps") {
  for (const char* stage : {"0", "1", "2"}) {
    CAPTURE(stage);
    run_ok(1, {"--file", kData + "dp4_adamw_clip.json", "--stage", stage});
    run_ok(2, {"--file", kData + "dp4_adamw_clip.json", "--stage", stage});
  }
  // no_sync: accumulate locally, reduce once (stages 0 and 1).
  run_ok(2, {"--file", kData + "dp4_adamw_clip.json", "--stage", "1", "--no-sync"});
  run_ok(1, {"--file", kData + "dp4_adamw_clip.json", "--stage", "0", "--no-sync"});
}

TEST_CASE("the loop with unit scopes, with and without no_sync scopes, at stages 0, 1, 2") {
  for (const char* stage : {"0", "1", "2"}) {
    CAPTURE(stage);
    run_ok(2, {"--file", kData + "dp2_adamw_clip.json", "--stage", stage, "--units"});
    run_ok(2, {"--file", kData + "dp4_adamw_clip.json", "--stage", stage, "--units", "--no-sync-scope"});
    run_ok(1, {"--file", kData + "dp4_adamw_clip.json", "--stage", stage, "--units", "--no-sync-scope"});
  }
  // The option form of no_sync, now at stage 2 too.
  run_ok(2, {"--file", kData + "dp4_adamw_clip.json", "--stage", "2", "--no-sync"});
}

TEST_CASE("stage 3 at world sizes 1, 2 and 4, with and without no_sync") {
  run_ok(2, {"--file", kData + "dp2_adamw_clip.json", "--stage", "3", "--units"});
  run_ok(4, {"--file", kData + "dp4_adamw_clip.json", "--stage", "3", "--units"});
  run_ok(1, {"--file", kData + "dp4_adamw_clip.json", "--stage", "3", "--units"});
  run_ok(2, {"--file", kData + "dp4_adamw_clip.json", "--stage", "3", "--units", "--no-sync-scope"});
}

// The same with unit scopes (one unit per parameter, so every unit starts on a block): stages 0-3
// bitwise equal at 4 ranks and at 1 rank x 4 micro-steps.
TEST_CASE("deterministic mode with units: stages 0-3 bitwise equal, and 4 ranks equal 1 rank x 4") {
  check_bitwise({{4, "3"}, {4, "0"}, {4, "1"}, {4, "2"}, {1, "3"}, {1, "0"}}, {"--units"}, "det_units");
}

TEST_CASE("optimizer offload reproduces PyTorch at stages 0-3 and world sizes 1, 2 and 4; parameter offload at stage 3") {
  for (const char* stage : {"0", "1", "2", "3"}) {
    CAPTURE(stage);
    run_ok(2, {"--file", kData + "dp2_adamw_clip.json", "--stage", stage, "--units", "--offload"});
  }
  run_ok(4, {"--file", kData + "dp4_adamw_clip.json", "--stage", "2", "--offload"});
  run_ok(4, {"--file", kData + "dp4_adamw_clip.json", "--stage", "3", "--units", "--offload"});
  run_ok(1, {"--file", kData + "dp4_adamw_clip.json", "--stage", "3", "--units", "--offload"});
  run_ok(2, {"--file", kData + "dp4_adamw_clip.json", "--stage", "2", "--units", "--no-sync-scope", "--offload"});
  // Stage 3 with the parameter shard offloaded too.
  run_ok(2, {"--file", kData + "dp2_adamw_clip.json", "--stage", "3", "--units", "--offload", "--offload-params"});
  run_ok(4, {"--file", kData + "dp4_adamw_clip.json", "--stage", "3", "--units", "--offload", "--offload-params"});
}

TEST_CASE("deterministic mode: optimizer (and parameter) offload is bitwise equal to no offload at stages 1-3") {
  const std::string off = deterministic_run(4, "2", {"--units"}, "det_offload");
  for (const char* stage : {"1", "2", "3"}) {
    CAPTURE(stage);
    CHECK(deterministic_run(4, stage, {"--units", "--offload"}, "det_offload") == off);
  }
  CHECK(deterministic_run(1, "3", {"--units", "--offload"}, "det_offload") == off);
  CHECK(deterministic_run(4, "3", {"--units", "--offload", "--offload-params"}, "det_offload") == off);
}

TEST_CASE("gradients reduced without grad_ready calls") {
  run_ok(2, {"--file", kData + "dp2_adamw_clip.json", "--stage", "2", "--grad-ready", "false"});
}

// 4 ranks sum ((g0 + g1) + g2) + g3 in rank order; one rank accumulating g0..g3 as micro-steps
// adds them in the same order. (2 ranks x 2 micro-steps add (g0 + g1) + (g2 + g3): not the same
// bits, and not claimed.)
TEST_CASE("deterministic mode: bitwise equal across stages, and 4 ranks equal 1 rank x 4 micro-steps") {
  check_bitwise({{4, "0"}, {4, "1"}, {4, "2"}, {1, "2"}, {1, "1"}, {1, "0"}}, {}, "det");
}

}  // namespace zero
