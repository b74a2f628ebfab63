// Fault injection under the launcher (tests/fault_worker.cc, base/fault_injection.h): one of three
// ranks is killed, stalls, or runs late at a chosen point of a training step. Every case must end
// well within the deadline (the communicator's and engine's timeout, 6 s here, plus the failure
// report) with an error on every surviving rank that names the operation and the failed rank, and a
// non-zero exit from zerorun naming the first failure; a checkpoint completed before a kill during
// the next save still loads.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "testing/launch.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;

// zerorun with 3 ranks and a report window longer than the deadline plus the failure report, so
// that a survivor stuck on the deadline still reports before it is stopped.
testing::LaunchResult launch3(const std::vector<std::string>& args, int ranks = 3,
                              const std::string& worker = "tests/fault_worker") {
  std::vector<std::string> all{"--nproc-per-node", std::to_string(ranks), "--report-s", "20", "--", worker};
  all.insert(all.end(), args.begin(), args.end());
  return testing::run("comm/launch/zerorun", all, 90);
}

std::string tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// The lines rank `r` printed.
std::string lines_of(const std::string& out, int r) {
  std::istringstream in(out);
  std::string line, mine;
  const std::string prefix = "[rank " + std::to_string(r) + "]";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) mine += line + "\n";
  }
  return mine;
}

// Whether `lines` name rank `r` among the ranks that did not reach a collective ("rank 1 did not
// reach it", "ranks 0, 1 did not reach it"): a survivor that fails at once (its connection to the
// dead rank reset) can also list a live rank still blocked in an earlier collective on the dead one.
bool listed_as_absent(const std::string& lines, int r) {
  const std::string tail = " did not reach it";
  for (size_t end = lines.find(tail); end != std::string::npos; end = lines.find(tail, end + 1)) {
    const size_t begin = lines.rfind("rank", end);
    if (begin == std::string::npos) continue;
    std::istringstream list(lines.substr(begin, end - begin));
    std::string word;
    list >> word;  // "rank" or "ranks"
    for (std::string rank; std::getline(list, rank, ',');) {
      if (std::stoi(rank) == r) return true;
    }
  }
  return false;
}

struct Fault {
  int stage;
  std::string plan;
  std::string operation;  // what the survivors' errors must name
  bool killed = true;     // the faulty rank is killed (else it stalls and is stopped by zerorun)
  std::vector<std::string> extra = {};
};

}  // namespace

namespace {

// Rank 1 of three fails as `f` says: every rank must end in time, the survivors naming rank 1 and the
// operation.
void check_fault(const Fault& f) {
  const auto t0 = Clock::now();
  std::vector<std::string> args = {"--stage", std::to_string(f.stage), "--fault", f.plan, "--fault-rank", "1",
                                    "--timeout-s", "6", "--steps", "12"};
  args.insert(args.end(), f.extra.begin(), f.extra.end());
  const auto r = launch3(args);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(took < 45);  // 6 s deadline, 2 s failure report, start-up; not Gloo's 300 s
  CHECK(r.output.find("fault injection:") != std::string::npos);
  if (f.killed) {
    // zerorun names the first failure: rank 1, killed.
    CHECK(r.output.find("zerorun: rank 1 (pid") != std::string::npos);
    CHECK(r.output.find("signal 9") != std::string::npos);
  }
  for (int survivor : {0, 2}) {
    CAPTURE(survivor);
    const std::string mine = lines_of(r.output, survivor);
    CHECK(mine.find("fault_worker:") != std::string::npos);  // ended with its own error
    // The failed rank is named: it never reached the call, or its data never came.
    const bool named = listed_as_absent(mine, 1) || mine.find("rank 1 failed first") != std::string::npos ||
                       mine.find("waiting for rank 1's data") != std::string::npos;
    CHECK_MESSAGE(named, mine);
    if (!f.operation.empty()) CHECK_MESSAGE(mine.find(f.operation) != std::string::npos, mine);
  }
}

}  // namespace

// One case per point of a step (tests/BUILD runs them as three targets, side by side: most of each
// case is waiting for a deadline).
TEST_CASE("killed in forward (stage 3)") { check_fault({3, "forward:kill:5", "all_gather"}); }
TEST_CASE("killed before a reduce-scatter (stage 2)") {
  check_fault({2, "reduce_scatter:kill:4", "reduce_scatter"});
}
TEST_CASE("killed while stage 3 prefetches") { check_fault({3, "prefetch:kill:6", "all_gather"}); }
TEST_CASE("killed in the optimizer step (stage 1)") { check_fault({1, "optimizer_step:kill:2", ""}); }
TEST_CASE("stalled silently mid-collective, alive (stage 2)") {
  check_fault({2, "collective_sends:stall:3", "reduce_scatter", false, {"--eager-bytes", "0"}});
}
TEST_CASE("late past the timeout (stage 2)") { check_fault({2, "optimizer_step:delay=30:2", "", false}); }

TEST_CASE("killed in a tensor-parallel all-reduce (dp 2 x tp 2): every rank ends in time, naming it") {
  // World ranks 0-1 and 2-3 each hold the GPT between them; 0-2 and 1-3 are the data-parallel
  // groups. Rank 1 dies in step 2's forward, in a g all-reduce with rank 0.
  const auto t0 = Clock::now();
  const auto r = launch3({"--tp", "2", "--stage", "2", "--fault", "tp_collective:kill:15", "--fault-rank", "1",
                          "--timeout-s", "6", "--steps", "12"},
                         4, "tests/mp_fault_worker");
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(took < 45);
  CHECK(r.output.find("zerorun: rank 1 (pid") != std::string::npos);
  CHECK(r.output.find("signal 9") != std::string::npos);
  for (int survivor : {0, 2, 3}) {
    CAPTURE(survivor);
    const std::string mine = lines_of(r.output, survivor);
    CHECK(mine.find("fault_worker:") != std::string::npos);  // ended with its own error
    // Its tensor-parallel peer (0) and its data-parallel peer (3) name it by its world rank.
    if (survivor != 2) CHECK_MESSAGE(mine.find("world rank 1)") != std::string::npos, mine);
  }
}

// Pipelines of two stages (1F1B, 4 micro-batches): dp 1 on 2 ranks, then dp 2 on 4 (the mesh puts
// pp outermost: world ranks 0-1 hold stage 0, 2-3 stage 1; 0 and 2 form one pipeline).
TEST_CASE("a stage function that throws mid-pipeline: every rank ends in time, naming the stage, action and micro-batch") {
  const auto t0 = Clock::now();
  // Rank 1 (pipeline rank 1, the last stage) throws at its 3rd compute action of step 2: 1F1B at
  // p = 2 runs F0 B0 F1 B1 ... there, so the 11th action overall is step 2's F1.
  const auto r = launch3({"--tp", "1", "--pp", "2", "--stage", "3", "--fault", "pipeline_action:throw:11", "--fault-rank",
                          "1", "--timeout-s", "6", "--steps", "4"},
                         2, "tests/mp_fault_worker");
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(took < 30);
  const std::string thrower = lines_of(r.output, 1);
  CHECK(thrower.find("pipeline rank 1: F of micro-batch 1 failed: fault injected at 'pipeline_action'") !=
        std::string::npos);
  // Its peer fails at once on the transfer it waited for, naming its own stage and action.
  const std::string peer = lines_of(r.output, 0);
  CHECK(peer.find("fault_worker:") != std::string::npos);
  CHECK(peer.find("pipeline rank 0:") != std::string::npos);
}

TEST_CASE("a rank killed mid-pipeline (pp 2 x dp 2): every rank ends in time, naming the lost one") {
  const auto t0 = Clock::now();
  const auto r = launch3({"--tp", "1", "--pp", "2", "--stage", "2", "--fault", "pipeline_action:kill:13", "--fault-rank",
                          "2", "--timeout-s", "6", "--steps", "4"},
                         4, "tests/mp_fault_worker");
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(took < 45);
  CHECK(r.output.find("zerorun: rank 2 (pid") != std::string::npos);
  CHECK(r.output.find("signal 9") != std::string::npos);
  for (int survivor : {0, 1, 3}) {
    CAPTURE(survivor);
    CHECK(lines_of(r.output, survivor).find("fault_worker:") != std::string::npos);  // ended with its own error
  }
  // Its pipeline peer (world rank 0, stage 0 of the same pipeline) names the action it was in.
  CHECK(lines_of(r.output, 0).find("pipeline rank 0:") != std::string::npos);
}

TEST_CASE("rank 0 killed: the store lives in zerorun, so the others fail at once and their reports name rank 0") {
  const auto t0 = Clock::now();
  const auto r = launch3({"--stage", "2", "--fault", "reduce_scatter:kill:4", "--fault-rank", "0", "--timeout-s", "6",
                          "--steps", "12"});
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 30);
  CHECK(r.output.find("zerorun: rank 0 (pid") != std::string::npos);
  for (int survivor : {1, 2}) {
    CAPTURE(survivor);
    const std::string mine = lines_of(r.output, survivor);
    CHECK(mine.find("fault_worker:") != std::string::npos);
    CHECK(mine.find("reduce_scatter") != std::string::npos);
    // Before zerorun hosted the store, rank 0 took it along and the report said only that the store
    // was lost; now the survivors still meet there and name the rank that never reached the call.
    CHECK(mine.find("(rank 0 did not reach it: exited, stalled, or stuck before it)") != std::string::npos);
  }
}

TEST_CASE("a rank killed while writing a checkpoint leaves the last complete one loadable") {
  const std::string dir = tmp("fault_ckpt");
  std::filesystem::remove_all(dir);
  // Saves after steps 2 and 4; rank 1 dies in the middle of the second save.
  const auto r = launch3({"--stage", "2", "--fault", "checkpoint_write:kill:2", "--fault-rank", "1", "--timeout-s", "6",
                          "--steps", "6", "--save", dir, "--save-every", "2"});
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("zerorun: rank 1 (pid") != std::string::npos);
  // The next job (at another world size) resumes from the save that completed.
  const auto resumed = launch3({"--stage", "3", "--resume", dir, "--steps", "4"}, 2);
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK(resumed.output.find("resumed at step 2") != std::string::npos);
}

}  // namespace zero
