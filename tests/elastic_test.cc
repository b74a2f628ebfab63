// zerorun --max-restarts with the GPT example (docs/reliability.md): a 4-rank run that loses a rank
// mid-run (rank 0, which no longer hosts the store, killed; or a rank stopped and found by the
// heartbeat) goes on on the others from its newest complete checkpoint at the layout they allow, with
// the same global batch, and trains the same steps as a run that lost nothing: the steps before the
// failure bit for bit (the same world), the ones after within rounding (another data-parallel
// width sums the micro-batches' gradients in another order).
#include <doctest/doctest.h>
#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <csignal>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/free_port.h"
#include "testing/launch.h"

namespace zero {
namespace {

constexpr int kSteps = 16, kSaveEvery = 4;

std::string tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// train_gpt under zerorun: 16 deterministic steps of a global batch of 48 rows, a checkpoint every 4
// steps into `save` and --resume auto from it.
testing::LaunchResult train(int nproc, const std::vector<std::string>& zerorun_flags, const std::string& save,
                            const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"--nproc-per-node", std::to_string(nproc), "--master-port", "0", "--report-s", "1"};
  args.insert(args.end(), zerorun_flags.begin(), zerorun_flags.end());
  for (const char* a : {"--", "examples/gpt/train_gpt", "--steps", "16", "--batch", "48", "--deterministic",
                              "--val-every", "16", "--sample-tokens", "0", "--save-every", "4", "--resume", "auto"}) {
    args.push_back(a);
  }
  args.push_back("--save");
  args.push_back(save);
  args.insert(args.end(), extra.begin(), extra.end());
  return testing::run("comm/launch/zerorun", args, 240);
}

// Each step's (last printed) loss line, cut after the loss, by step; and the last validation loss.
struct Curve {
  std::map<int, std::string> steps;
  double validation = NAN;
};

Curve curve(const std::string& out) {
  Curve c;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const size_t p = line.find("[rank 0] step ");
    if (p == std::string::npos) continue;
    const int step = std::stoi(line.substr(p + 14));
    if (const size_t v = line.find("validation loss "); v != std::string::npos) {
      c.validation = std::stod(line.substr(v + 16));
    } else if (const size_t l = line.find("| loss "); l != std::string::npos) {
      c.steps[step] = line.substr(l, line.find(" | norm") - l);
    }
  }
  return c;
}

double loss_in(const std::string& cut) { return std::stod(cut.substr(7)); }

// The restarted run's curve against the uninterrupted one: every step there, the steps before
// `resumed_at` (the same world, before the failure) the same text, the later ones and the final
// validation loss within 1e-3 relative.
void check_against(const Curve& got, const Curve& reference, int resumed_at) {
  REQUIRE(got.steps.size() == static_cast<size_t>(kSteps));
  for (const auto& [step, cut] : got.steps) {
    CAPTURE(step);
    REQUIRE(reference.steps.count(step) == 1);
    if (step <= resumed_at) {
      CHECK(cut == reference.steps.at(step));
    } else {
      CHECK(std::abs(loss_in(cut) - loss_in(reference.steps.at(step))) <= 1e-3 * loss_in(reference.steps.at(step)));
    }
  }
  CHECK(std::abs(got.validation - reference.validation) <= 1e-3 * reference.validation);
}

// The same run on 4 ranks, nothing lost.
const Curve& uninterrupted() {
  static const Curve c = [] {
    const std::string save = tmp("elastic_reference");
    std::filesystem::remove_all(save);
    const testing::LaunchResult r = train(4, {}, save, {"--micro-batches", "3"});
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return curve(r.output);
  }();
  return c;
}

TEST_CASE("rank 0 killed at step 10 of 16: the job goes on on 3 ranks from step 8, dp 3 x 4 micro-batches") {
  const std::string save = tmp("elastic_kill0");
  std::filesystem::remove_all(save);
  const testing::LaunchResult r =
      train(4, {"--max-restarts", "1"}, save, {"--micro-batches", "3", "--fault", "optimizer_step:kill:10", "--fault-rank", "0"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("zerorun: rank 0 (pid ") != std::string::npos);
  CHECK(r.output.find("zerorun: restart 1 of 1: lost rank(s) 0 of 4; starting the job again on 3 rank(s)") !=
        std::string::npos);
  CHECK(r.output.find("[rank 0] restart 1 after rank 0 (pid ") != std::string::npos);
  CHECK(r.output.find("dp 3 x tp 1 x pp 1, stage 3, 4 micro-batches on 3 of the 4 ranks launched") != std::string::npos);
  // Killed in step 10's update: steps 9 and 10 are lost, at most --save-every.
  CHECK(r.output.find("[rank 0] resumed from " + save + " at step 8") != std::string::npos);
  CHECK(r.output.find("[rank 0] restart 1: step 9 trained ") != std::string::npos);
  check_against(curve(r.output), uninterrupted(), 8);
}

TEST_CASE("a rank stopped (SIGSTOP) at step 7: the heartbeat finds it; 2 ranks left run dp 1 and keep a spare") {
  const std::string save = tmp("elastic_stop");
  std::filesystem::remove_all(save);
  // 3 ranks of 16 rows each; on 2, 48 rows do not split into micro-batches of 16 on dp 2, so dp 1
  // runs 3 of them and rank 1 waits.
  const testing::LaunchResult r = train(3, {"--max-restarts", "1", "--heartbeat-s", "2"}, save,
                                        {"--fault", "optimizer_step:stop:7", "--fault-rank", "1"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("zerorun: rank 1 (pid ") != std::string::npos);
  CHECK(r.output.find("(--heartbeat-s): stopped or frozen; killed it") != std::string::npos);
  CHECK(r.output.find("zerorun: restart 1 of 1: lost rank(s) 1 of 3; starting the job again on 2 rank(s)") !=
        std::string::npos);
  CHECK(r.output.find("dp 1 x tp 1 x pp 1, stage 3, 3 micro-batches on 1 of the 3 ranks launched") != std::string::npos);
  CHECK(r.output.find("[rank 1] rank 1: a spare (the layout dp 1 x tp 1 x pp 1, stage 3, 3 micro-batches takes 1 of the "
                      "2 ranks left); it waits as a replacement") != std::string::npos);
  CHECK(r.output.find("[rank 0] resumed from " + save + " at step 4") != std::string::npos);
  // Another layout from the first step: all within rounding of the 4-rank run (16 rows per micro-batch).
  check_against(curve(r.output), uninterrupted(), 0);
}

TEST_CASE("dp 2 x tp 2, rank 3 killed: tp 2 kept (dp 1 and a spare), from the model-parallel save that completed alone") {
  const std::string save = tmp("elastic_tp");
  std::filesystem::remove_all(save);
  // The save after step 8 is asynchronous; its top manifest is written by the save's own thread (before,
  // only by the next save or the run's end: a kill in between left no complete checkpoint).
  const testing::LaunchResult r =
      train(4, {"--max-restarts", "1"}, save, {"--tp", "2", "--micro-batches", "4", "--fault", "optimizer_step:kill:11@3"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("dp 1 x tp 2 x pp 1, stage 3, 8 micro-batches on 2 of the 4 ranks launched") != std::string::npos);
  CHECK(r.output.find("[rank 2] rank 2: a spare") != std::string::npos);
  CHECK(r.output.find("[rank 0] resumed from " + save + " at step 8 (saved at dp 2 x tp 2 x pp 1") != std::string::npos);
  check_against(curve(r.output), uninterrupted(), 0);
}

TEST_CASE("a checkpoint in memory every 3 steps beside the files every 4: killed in step 11, resumed at 9, not 8") {
  const std::string save = tmp("elastic_memory");
  // In the node's memory, under a name of this test's own (the runs of several checkouts may share it).
  const std::string memory = "/dev/shm/zero_elastic_test_" + std::to_string(::getpid());
  for (const std::string& d : {save, memory}) std::filesystem::remove_all(d);
  const testing::LaunchResult r =
      train(4, {"--max-restarts", "1"}, save,
            {"--micro-batches", "3", "--save-memory", memory, "--save-memory-every", "3", "--fault", "optimizer_step:kill:11@1"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // Killed in step 11: the files hold step 8, the memory step 9.
  CHECK(r.output.find("[rank 0] resumed from " + memory + "/node-0 at step 9") != std::string::npos);
  check_against(curve(r.output), uninterrupted(), 9);
  // The run ended with its files: the copy in memory is gone.
  CHECK_FALSE(std::filesystem::exists(memory));
  CHECK(std::filesystem::exists(save + "/manifest.json"));
}

TEST_CASE("a bit flipped in rank 2's shard after step 5: caught at step 6, the job rolls back without rank 2") {
  const std::string save = tmp("elastic_flip");
  std::filesystem::remove_all(save);
  // Checked every 3 steps: the shard's checksums recorded at the end of step 5, the flip right after,
  // the check as step 6's update begins; the job goes on from the checkpoint after step 4, taken
  // before the flip (the one after step 8 is never taken: the check stops the job first).
  const testing::LaunchResult r = train(4, {"--max-restarts", "1"}, save,
                                        {"--micro-batches", "3", "--check-replicas", "3", "--fault", "shard_at_rest:flip:5@2"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find(" on rank 2 changed at rest between step 5 and step 6 (CRC32C ") != std::string::npos);
  // The rank at fault reports first (the others a moment later), so the restart leaves it out.
  CHECK(r.output.find("zerorun: restart 1 of 1: lost rank(s) 2 of 4; starting the job again on 3 rank(s)") !=
        std::string::npos);
  CHECK(r.output.find("[rank 0] resumed from " + save + " at step 4") != std::string::npos);
  check_against(curve(r.output), uninterrupted(), 4);
}

TEST_CASE("--save-memory outside memory or without its interval, --resume auto with nowhere to look, a bad --fault: named") {
  struct statfs fs {};
  REQUIRE(::statfs(tmp("").c_str(), &fs) == 0);
  testing::LaunchResult r;
  if (static_cast<unsigned long>(fs.f_type) != TMPFS_MAGIC) {  // the test's directory on a disk, as usual
    r = testing::run("examples/gpt/train_gpt", {"--steps", "1", "--save-memory", tmp("on_disk"), "--save-memory-every", "2"});
    CHECK(r.exit_code != 0);
    CHECK(r.output.find("is not in memory (not tmpfs); use a directory under /dev/shm") != std::string::npos);
  }
  r = testing::run("examples/gpt/train_gpt", {"--steps", "1", "--save-memory", "/dev/shm/zero_x"});
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("--save-memory /dev/shm/zero_x needs --save-memory-every K >= 1") != std::string::npos);
  r = testing::run("examples/gpt/train_gpt", {"--steps", "1", "--resume", "auto"});
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("--resume auto resumes from what --save DIR (or --save-memory DIR) holds: it needs one") !=
        std::string::npos);
  r = testing::run("examples/gpt/train_gpt", {"--steps", "1", "--fault", "forward:kill@one"});
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("--fault 'forward:kill@one': expected PLAN@RANK or PLAN@RANK/ATTEMPT") != std::string::npos);
  r = testing::run("examples/gpt/train_gpt", {"--steps", "1", "--fault", "forward:kill@1,prefetch:kill@1"});
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("rank 1 already has a plan in attempt 0") != std::string::npos);
}


// A job of several launchers on this machine ("nodes"): its files (`save`), its memory checkpoints'
// directory (under /dev/shm, named for this test process), its port and job token.
struct NodesJob {
  std::string save, memory, port;
  explicit NodesJob(const std::string& name, const std::string& save_dir = "")
      : save(save_dir.empty() ? tmp("elastic_" + name) : save_dir),
        memory("/dev/shm/zero_elastic_" + name + "_" + std::to_string(::getpid())),
        port(std::to_string(testing::free_port())) {
    std::filesystem::remove_all(save);
    std::filesystem::remove_all(memory);
    ::setenv("ZERO_JOB_TOKEN", ("elastic-" + name).c_str(), 1);
  }
  ~NodesJob() {
    ::unsetenv("ZERO_JOB_TOKEN");
    std::filesystem::remove_all(memory);
  }
  // Node k's zerorun of `nproc` ranks (--nnodes `nnodes`, --max-restarts `restarts`): train_gpt with
  // a memory checkpoint every 3 steps, `micro` micro-batches and the fault plan `faults`.
  testing::LaunchResult node(int k, int nproc, const std::string& nnodes, int restarts, int micro,
                             const std::string& faults) const {
    return train(nproc,
                 {"--nnodes", nnodes, "--node-rank", std::to_string(k), "--master-addr", "127.0.0.1", "--master-port",
                  port, "--max-restarts", std::to_string(restarts)},
                 save, {"--micro-batches", std::to_string(micro), "--save-memory", memory, "--save-memory-every", "3",
                        "--fault", faults});
  }
};

TEST_CASE("two launchers x 2 ranks: node 1's rank 3 killed at step 10; the job goes on as 2 + 1 ranks from step 8") {
  const NodesJob job("two_nodes");
  const std::string& save = job.save;
  const auto node = [&](int k) {
    return train(2, {"--nnodes", "2", "--node-rank", std::to_string(k), "--master-addr", "127.0.0.1", "--master-port", job.port,
                     "--max-restarts", "1"},
                 save, {"--micro-batches", "3", "--fault", "optimizer_step:kill:10@3"});
  };
  testing::LaunchResult second;
  std::thread one([&] { second = node(1); });
  const testing::LaunchResult first = node(0);
  one.join();
  INFO("node 0:\n" << first.output << "\nnode 1:\n" << second.output);
  REQUIRE(first.exit_code == 0);
  REQUIRE(second.exit_code == 0);
  CHECK(second.output.find("zerorun: restart 1 of 1: lost rank(s) 3 of this node's 2; starting its 1 rank(s) again") !=
        std::string::npos);
  CHECK(first.output.find("zerorun: the job failed elsewhere first (node 1: rank 3 (pid ") != std::string::npos);
  CHECK(first.output.find("zerorun: attempt 1 runs on node 0: 2 ranks, node 1: 1 rank (3 ranks)") != std::string::npos);
  CHECK(first.output.find("dp 3 x tp 1 x pp 1, stage 3, 4 micro-batches on 3 of the 4 ranks launched") != std::string::npos);
  CHECK(first.output.find("[rank 0] resumed from " + save + " at step 8") != std::string::npos);
  check_against(curve(first.output), uninterrupted(), 8);
}

// Whether any process's command line holds `text` (/proc/*/cmdline).
bool process_with(const std::string& text) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    if (cmdline.find(text) != std::string::npos) return true;
  }
  return false;
}

// A directory that a test can make read-only while a job writes into it: a bind mount of itself
// (root only; `ok` false elsewhere), taken away at the end.
struct ReadOnlyLater {
  std::string dir;
  bool ok = false;
  explicit ReadOnlyLater(std::string d) : dir(std::move(d)) {
    std::filesystem::create_directories(dir);
    ok = ::mount(dir.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) == 0;
  }
  bool make_read_only() const {
    return ok && ::mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0;
  }
  ~ReadOnlyLater() {
    if (ok) ::umount2(dir.c_str(), MNT_DETACH);
  }
};

TEST_CASE("two launchers x 2 ranks, memory checkpoints with copies on the other node, the files read-only after "
          "their first save: node 1 lost whole in step 11, node 0 goes on from step 9 out of its memory") {
  const ReadOnlyLater files(tmp("elastic_buddies"));
  const NodesJob job("buddies", files.dir + "/ckpt");
  const std::string &save = job.save, &memory = job.memory;
  // Rank 0 pauses 2 s in step 5, while the checkpoint of step 4 completes and the directory turns
  // read-only; rank 2 (node 1) kills its zerorun, and so node 1, in step 11.
  const auto node = [&](int k) {
    return job.node(k, 2, "1:2", 1, 3, "optimizer_step:delay=2:5@0,optimizer_step:kill_parent:11@2");
  };
  bool read_only = false;
  std::thread watch([&] {
    for (int i = 0; i < 6000 && !std::filesystem::exists(save + "/manifest.json"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    read_only = files.make_read_only();
  });
  testing::LaunchResult second;
  std::thread one([&] { second = node(1); });
  const testing::LaunchResult first = node(0);
  one.join();
  watch.join();
  INFO("node 0:\n" << first.output << "\nnode 1:\n" << second.output);
  REQUIRE(first.exit_code == 0);
  CHECK(second.exit_code == 128 + SIGKILL);
  CHECK(first.output.find("node 1's zerorun stopped answering (lost with its ranks)") != std::string::npos);
  CHECK(first.output.find("zerorun: attempt 1 runs on node 0: 2 ranks (2 ranks)") != std::string::npos);
  // Node 0's memory held node 1's ranks' data files too: their copies.
  CHECK(first.output.find("[rank 0] resumed from " + memory + "/node-0 at step 9") != std::string::npos);
  check_against(curve(first.output), uninterrupted(), 9);
  if (read_only) {
    CHECK(first.output.find("[rank 0] checkpoint into " + save + " failed; going on with the checkpoints in memory") !=
          std::string::npos);
    CHECK(first.output.find("[rank 0] no checkpoint of the end in " + save + " (its save failed)") != std::string::npos);
  } else {
    MESSAGE("the files could not be made read-only here (not root?): that part is not shown");
  }
  CHECK_FALSE(process_with(memory));
}

TEST_CASE("two launchers x 2 ranks: node 1 lost whole in step 7, node 0 goes on alone; a replacement node 1 "
          "joins and the job starts again on 4 ranks with it, its memory filled from node 0's") {
  const NodesJob job("replacement");
  const std::string& memory = job.memory;
  // Attempt 0: rank 2 takes node 1 down in step 7. Attempt 1 (node 0 alone, from about 2.5 s after
  // that): rank 0 pauses 6 s in its second step. The replacement comes 3.5 s after node 1 went, while
  // attempt 1 runs (had it come before node 0 formed attempt 1, attempt 1 would have taken it).
  const auto node = [&](int k) {
    return job.node(k, 2, "1:2", 2, 3, "optimizer_step:kill_parent:7@2/0,optimizer_step:delay=6:2@0/1");
  };
  testing::LaunchResult lost, replacement;
  std::thread one([&] {
    lost = node(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));
    replacement = node(1);
  });
  const testing::LaunchResult first = node(0);
  one.join();
  INFO("node 0:\n" << first.output << "\nnode 1:\n" << lost.output << "\nnode 1 again:\n" << replacement.output);
  REQUIRE(first.exit_code == 0);
  CHECK(lost.exit_code == 128 + SIGKILL);
  CHECK(replacement.exit_code == 0);
  CHECK(first.output.find("zerorun: attempt 1 runs on node 0: 2 ranks (2 ranks)") != std::string::npos);
  CHECK(replacement.output.find("zerorun: the job is at attempt 1; this node joins the next, which node 0 starts with "
                                "it") != std::string::npos);
  CHECK(first.output.find("zerorun: a node joined the job, which starts again with it; stopping this node's ranks") !=
        std::string::npos);
  CHECK(first.output.find("zerorun: attempt 2 runs on node 0: 2 ranks, node 1: 2 ranks (4 ranks)") != std::string::npos);
  CHECK(first.output.find("[rank 0] restart 2 after node 0: a node joined the job, which starts again with it: dp 4 x "
                          "tp 1 x pp 1, stage 3, 3 micro-batches on 4 of the 4 ranks launched") != std::string::npos);
  CHECK(first.output.find("[rank 0] resumed from " + memory + "/node-0 at step ") != std::string::npos);
  check_against(curve(first.output), uninterrupted(), 6);
  CHECK_FALSE(process_with(memory));
}

TEST_CASE("--save-memory with tp 2 on two launchers: refused by name before the first step") {
  const NodesJob job("tp_refused");
  const std::string& memory = job.memory;
  const auto node = [&](int k) {
    return testing::run("comm/launch/zerorun",
                        {"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", std::to_string(k), "--master-addr",
                         "127.0.0.1", "--master-port", job.port, "--", "examples/gpt/train_gpt", "--steps", "2", "--tp",
                         "2", "--save-memory", memory, "--save-memory-every", "1"},
                        120);
  };
  testing::LaunchResult second;
  std::thread one([&] { second = node(1); });
  const testing::LaunchResult first = node(0);
  one.join();
  INFO("node 0:\n" << first.output << "\nnode 1:\n" << second.output);
  CHECK(first.exit_code != 0);
  CHECK(second.exit_code != 0);
  CHECK(first.output.find("--save-memory " + memory + ": ranks 0 and 2 are on different nodes (0 and 1)") !=
        std::string::npos);
  CHECK(first.output.find("step    1") == std::string::npos);
}

TEST_CASE("three launchers x 1 rank: nodes 1 and 2 lost together in step 11, rank 1's data file and its copy with "
          "them: the memory save is passed over by name, and node 0 goes on from the files of step 8") {
  const NodesJob job("buddy_lost");
  const std::string &save = job.save, &memory = job.memory;
  const auto node = [&](int k) {
    return job.node(k, 1, "1:3", 1, 4, "optimizer_step:kill_parent:11@1,optimizer_step:kill_parent:11@2");
  };
  testing::LaunchResult second, third;
  std::thread one([&] { second = node(1); });
  std::thread two([&] { third = node(2); });
  const testing::LaunchResult first = node(0);
  one.join();
  two.join();
  INFO("node 0:\n" << first.output << "\nnode 1:\n" << second.output << "\nnode 2:\n" << third.output);
  REQUIRE(first.exit_code == 0);
  CHECK(second.exit_code == 128 + SIGKILL);
  CHECK(third.exit_code == 128 + SIGKILL);
  CHECK(first.output.find("zerorun: attempt 1 runs on node 0: 1 rank (1 ranks)") != std::string::npos);
  CHECK(first.output.find("[rank 0] --resume auto: passed over the save of step 9 in '" + memory +
                          "/node-0': no node holds rank 1's data file (lost with its node and its buddy's)") !=
        std::string::npos);
  CHECK(first.output.find("[rank 0] resumed from " + save + " at step 8") != std::string::npos);
  // Another world than the reference's from the start (3 ranks, then 1): within rounding throughout.
  check_against(curve(first.output), uninterrupted(), 0);
  CHECK_FALSE(process_with(memory));
}

TEST_CASE("a second rank killed while the restarted job restores: a second restart from the same checkpoint") {
  const std::string save = tmp("elastic_twice");
  std::filesystem::remove_all(save);
  // Attempt 0 loses rank 2 in step 10; attempt 1 (3 ranks) loses rank 1 at its first forward, right
  // after loading; attempt 2 (2 ranks: dp 2 x 6 micro-batches) finishes.
  const testing::LaunchResult r = train(4, {"--max-restarts", "2"}, save,
                                        {"--micro-batches", "3", "--fault", "optimizer_step:kill:10@2,forward:kill:1@1/1"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("zerorun: restart 1 of 2: lost rank(s) 2 of 4; starting the job again on 3 rank(s)") !=
        std::string::npos);
  CHECK(r.output.find("zerorun: restart 2 of 2: lost rank(s) 1 of 3; starting the job again on 2 rank(s)") !=
        std::string::npos);
  CHECK(r.output.find("dp 2 x tp 1 x pp 1, stage 3, 6 micro-batches on 2 of the 4 ranks launched") != std::string::npos);
  // The second restart resumed from the step 8 checkpoint too: the kill during the restore lost no
  // complete checkpoint. (Attempt 1's own lines may be lost: its ranks were stopped by SIGTERM with
  // their output still buffered.)
  const size_t second = r.output.find("[rank 0] restart 2 after rank 1 (pid ");
  REQUIRE(second != std::string::npos);
  CHECK(r.output.find("[rank 0] resumed from " + save + " at step 8", second) != std::string::npos);
  check_against(curve(r.output), uninterrupted(), 8);
  // No rank of any attempt is left behind.
  CHECK_FALSE(process_with(save));
}

}  // namespace
}  // namespace zero
