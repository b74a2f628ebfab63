// Engine behaviour across real processes: errors raised on every rank (never a hang), overflow steps
// skipped alike on every rank, 16-bit parameters identical across ranks and (deterministic) stages
// 0-3.
#include <doctest/doctest.h>

#include <chrono>
#include <regex>
#include <set>
#include <string>

#include "testing/launch.h"

namespace zero {
namespace {

const std::string kWorker = "tests/engine_worker";

testing::LaunchResult run(int nproc, const std::vector<std::string>& args) {
  return testing::launch(nproc, kWorker, args, 90);
}

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

std::set<std::string> digests(const std::string& out) {
  std::set<std::string> d;
  for (size_t p = out.find("RESULT digest "); p != std::string::npos; p = out.find("RESULT digest ", p + 1)) {
    d.insert(out.substr(p + 14, 33));
  }
  return d;
}

}  // namespace

TEST_CASE("mismatched registration fails on every rank and names the difference") {
  const auto r = run(2, {"--scenario", "mismatch"});
  INFO(r.output);
  CHECK(r.exit_code != 0);
  // Both ranks report it (zerorun may stop the second, but each reached the check).
  CHECK(count(r.output, "differs across ranks") >= 1);
  CHECK(r.output.find("rank 1 registered 'w' shape [100, 50]") != std::string::npos);
  CHECK(r.output.find("rank 0 registered 'w' shape [50, 100]") != std::string::npos);
}

TEST_CASE("a gradient buffer of the wrong size fails on every rank, naming parameter and rank") {
  const auto r = run(2, {"--scenario", "bad-grad"});
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("rank 0: parameter 'b': gradient pointer holds 99 elements") != std::string::npos);
}

TEST_CASE("step() before finalize() is a clear error") {
  const auto r = run(2, {"--scenario", "early-step"});
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("step() called before finalize()") != std::string::npos);
}

TEST_CASE("a rank that leaves makes the others fail quickly instead of hanging") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run(2, {"--scenario", "rank-exits"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("[rank 0] RESULT error:") != std::string::npos);
  CHECK(seconds < 30.0);
}

TEST_CASE("an overflow on one rank skips the step on every rank and backs off the scale") {
  for (const char* stage : {"0", "1", "2", "3"}) {
    for (const char* dtype : {"fp16", "bf16"}) {
      CAPTURE(stage);
      CAPTURE(dtype);
      const auto r = run(2, {"--scenario", "overflow", "--stage", stage, "--dtype", dtype});
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      CHECK(count(r.output, "RESULT step 1 skipped 0 scale 1024 next_scale 1024 unchanged 0") == 2);
      CHECK(count(r.output, "RESULT step 2 skipped 1 scale 1024 next_scale 512 unchanged 1") == 2);
      CHECK(count(r.output, "RESULT step 3 skipped 0 scale 512 next_scale 512 unchanged 0") == 2);
      CHECK(digests(r.output).size() == 1);  // both ranks hold the same parameters
    }
  }
}

TEST_CASE("16-bit parameters: identical on every rank; deterministic mode identical across stages") {
  for (const char* dtype : {"fp16", "bf16"}) {
    std::set<std::string> all;
    for (const char* stage : {"0", "1", "2", "3"}) {
      CAPTURE(dtype);
      CAPTURE(stage);
      const auto r = run(3, {"--scenario", "mixed", "--stage", stage, "--dtype", dtype, "--deterministic"});
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      const auto d = digests(r.output);
      CHECK(d.size() == 1);
      all.insert(d.begin(), d.end());
    }
    CHECK(all.size() == 1);
  }
}

}  // namespace zero
