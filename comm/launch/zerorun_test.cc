// Runs the real zerorun binary on zerorun_test_prog (both from the runfiles) and checks what it
// prints and how it exits.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/free_port.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Runfiles paths, relative to the runfiles root Bazel starts the test in.
const char* const kZerorun = "comm/launch/zerorun";
const char* const kProg = "comm/test_programs/zerorun_test_prog";

struct Result {
  int code = -1;  // exit status, 128 + signal, or -1 when the harness had to kill it
  std::string out, err;
  double seconds = 0;
};

// Starts zerorun with args, calls `during(pid)` once as soon as `ready(stdout so far)` holds, and
// collects its output until it exits (killing it after `limit`).
Result run(const std::vector<std::string>& args, std::chrono::milliseconds limit = 30s,
           std::function<void(pid_t)> during = nullptr,
           std::function<bool(const std::string&)> ready = nullptr) {
  int out[2], err[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
  std::vector<std::string> full = {kZerorun};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  const auto start = Clock::now();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  ::close(out[1]);
  ::close(err[1]);
  Result r;
  int fds[2] = {out[0], err[0]};
  std::string* sinks[2] = {&r.out, &r.err};
  bool called = during == nullptr;
  int status = 0;
  bool exited = false;
  while (!exited || fds[0] >= 0 || fds[1] >= 0) {
    if (!called && (!ready || ready(r.out))) {
      during(pid);
      called = true;
    }
    if (Clock::now() - start > limit) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.code = -1;
      for (int fd : fds) {
        if (fd >= 0) ::close(fd);
      }
      FAIL("zerorun did not finish within the limit; stderr: " << r.err);
      return r;
    }
    pollfd p[2];
    int n = 0;
    int which[2];
    for (int i = 0; i < 2; ++i) {
      if (fds[i] >= 0) {
        p[n] = {fds[i], POLLIN, 0};
        which[n++] = i;
      }
    }
    if (n > 0) ::poll(p, static_cast<nfds_t>(n), 20);
    for (int k = 0; k < n; ++k) {
      if (p[k].revents == 0) continue;
      char buf[65536];
      const ssize_t got = ::read(fds[which[k]], buf, sizeof(buf));
      if (got > 0) {
        sinks[which[k]]->append(buf, static_cast<size_t>(got));
      } else {
        ::close(fds[which[k]]);
        fds[which[k]] = -1;
      }
    }
    if (!exited && ::waitpid(pid, &status, WNOHANG) == pid) exited = true;
    if (n == 0 && !exited) ::usleep(10000);
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_CASE("three ranks print their environment with prefixed, whole lines") {
  const Result r = run({"--nproc-per-node", "3", "--", kProg, "env"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(r.code == 0);
  std::set<int> ranks;
  std::set<std::string> ports, tokens;
  for (const auto& line : lines(r.out)) {
    int prefix_rank = -1, prefix_len = 0;
    CHECK_MESSAGE((std::sscanf(line.c_str(), "[rank %d] %n", &prefix_rank, &prefix_len) == 1 &&
                   prefix_len == 9 && prefix_rank >= 0 && prefix_rank < 3),
                  line);
    // "[rank R] rank=R world=3 local=R/3 group=0 addr=127.0.0.1 port=P token=T store_in_launcher=1"
    int rank = -1, world = -1, local = -1, local_world = -1, group = -1, end = 0;
    char addr[64] = {}, port[16] = {}, token[80] = {}, fd[16] = {};
    if (std::sscanf(line.c_str(),
                    "[rank %*d] rank=%d world=%d local=%d/%d group=%d addr=%63s port=%15s "
                    "token=%79s store_in_launcher=%15s%n",
                    &rank, &world, &local, &local_world, &group, addr, port, token, fd, &end) == 9) {
      CHECK(static_cast<size_t>(end) == line.size());
      CHECK(rank == prefix_rank);
      CHECK(local == rank);
      CHECK(world == 3);
      CHECK(local_world == 3);
      CHECK(group == 0);
      CHECK(std::string(addr) == "127.0.0.1");
      ranks.insert(rank);
      ports.insert(port);
      tokens.insert(token);
      CHECK(std::string(token).size() == 32);
      CHECK(std::string(token).find_first_not_of("0123456789abcdef") == std::string::npos);
      // zerorun hosts the store: every rank, rank 0 included, is its client.
      CHECK(std::string(fd) == "1");
    }
  }
  CHECK(ranks == std::set<int>{0, 1, 2});
  CHECK(ports.size() == 1);
  CHECK(*ports.begin() != "0");
  CHECK(tokens.size() == 1);
  for (int k = 0; k < 3; ++k) {
    const std::string rk = "[rank " + std::to_string(k) + "] ";
    // Written in two pieces 30 ms apart: still one line.
    CHECK(contains(r.out, rk + "first half second half " + std::to_string(k) + "\n"));
    // The unterminated last line is still emitted, terminated.
    CHECK(contains(r.out, rk + "no newline at the end " + std::to_string(k) + "\n"));
    CHECK(contains(r.err, rk + "to stderr from " + std::to_string(k) + "\n"));
  }
}

TEST_CASE("a rank exiting 3 stops the others and zerorun exits 3 promptly") {
  const Result r = run({"--nproc-per-node=3", "--", kProg, "fail", "1", "3"});
  INFO("stderr:\n" << r.err);
  CHECK(r.code == 3);
  CHECK(r.seconds < 10);
  CHECK(contains(r.err, "rank 1"));
  CHECK(contains(r.err, "exited with status 3"));
}

TEST_CASE("ranks that ignore SIGTERM are killed after the grace period") {
  std::string dir = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
                    "/zerorun_test.XXXXXX";
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  const Result r = run({"--nproc-per-node=3", "--grace-s=0.5", "--", kProg, "stubborn", "2", "5", dir});
  INFO("stderr:\n" << r.err);
  CHECK(r.code == 5);
  CHECK(r.seconds < 10);
  CHECK(contains(r.err, "SIGKILL"));
}

TEST_CASE("a rank killed by a signal gives 128 + signal") {
  const Result r = run({"--nproc-per-node=2", "--", kProg, "crash", "0"});
  INFO("stderr:\n" << r.err);
  CHECK(r.code == 128 + SIGKILL);
  CHECK(r.seconds < 10);
  CHECK(contains(r.err, "SIGKILL"));
}

// True once every rank 0..n-1 said it is sleeping (its signal handlers are installed by then).
std::function<bool(const std::string&)> all_sleeping(int n) {
  return [n](const std::string& out) {
    for (int k = 0; k < n; ++k) {
      if (!contains(out, "rank " + std::to_string(k) + " sleeping")) return false;
    }
    return true;
  };
}

TEST_CASE("SIGTERM to zerorun is forwarded to every rank") {
  const Result r = run({"--nproc-per-node=3", "--", kProg, "sleep"}, 30s,
                       [](pid_t pid) { ::kill(pid, SIGTERM); }, all_sleeping(3));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(r.code == 128 + SIGTERM);
  for (int k = 0; k < 3; ++k) {
    CHECK(contains(r.out, "[rank " + std::to_string(k) + "] rank " + std::to_string(k) + " got signal " +
                              std::to_string(SIGTERM)));
  }
}

TEST_CASE("SIGINT to zerorun is forwarded as SIGINT") {
  const Result r = run({"--nproc-per-node=2", "--", kProg, "sleep"}, 30s,
                       [](pid_t pid) { ::kill(pid, SIGINT); }, all_sleeping(2));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(r.code == 128 + SIGINT);
  CHECK(contains(r.out, "[rank 1] rank 1 got signal " + std::to_string(SIGINT)));
}

TEST_CASE("--timeout-s stops the job with 124") {
  const Result r = run({"--nproc-per-node=2", "--timeout-s=1", "--grace-s=1", "--", kProg, "fail", "9", "0"});
  INFO("stderr:\n" << r.err);
  CHECK(r.code == 124);
  CHECK(r.seconds >= 0.9);
  CHECK(r.seconds < 10);
  CHECK(contains(r.err, "--timeout-s"));
}

TEST_CASE("a rank's leftover child does not keep zerorun waiting") {
  const Result r = run({"--nproc-per-node=2", "--", kProg, "orphan"});
  CHECK(r.code == 0);
  CHECK(r.seconds < 10);
}

TEST_CASE("a very long line arrives complete, in prefixed pieces") {
  const Result r = run({"--", kProg, "longline", "200000"});
  CHECK(r.code == 0);
  size_t xs = 0;
  for (const auto& line : lines(r.out)) {
    REQUIRE(line.rfind("[rank 0] ", 0) == 0);
    xs += line.size() - 9;
  }
  CHECK(xs == 200000);
}

TEST_CASE("a program that cannot be started exits 127") {
  const Result r = run({"--nproc-per-node=2", "--", "/nonexistent/program"});
  CHECK(r.code == 127);
  CHECK(contains(r.err, "cannot execute '/nonexistent/program'"));
}

TEST_CASE("bad arguments exit 2 naming the flag") {
  Result r = run({"--nproc-per-node", "abc", "--", kProg, "env"});
  CHECK(r.code == 2);
  CHECK(contains(r.err, "--nproc-per-node"));
  r = run({"--frobnicate", "--", kProg});
  CHECK(r.code == 2);
  CHECK(contains(r.err, "--frobnicate"));
  r = run({"--nnodes=2", "--master-addr=127.0.0.1", "--", kProg});
  CHECK(r.code == 2);
  CHECK(contains(r.err, "--master-port"));
  r = run({});
  CHECK(r.code == 2);
  r = run({"--help"});
  CHECK(r.code == 0);
  CHECK(contains(r.out, "usage: zerorun"));
}

TEST_CASE("ranks rendezvous through connect_store(read_dist_env()) at 2, 3 and 4 ranks") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    const Result r = run({"--nproc-per-node=" + std::to_string(n), "--timeout-s=50", "--", kProg, "store", "5"});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(r.code == 0);
    for (int k = 0; k < n; ++k) {
      CHECK(contains(r.out, "[rank " + std::to_string(k) + "] store ok rank " + std::to_string(k) + " of " +
                                std::to_string(n) + " (torchrun, 5 rounds)"));
    }
  }
}

TEST_CASE("an explicit --master-port is used by rank 0's server") {
  // Learn a free port from a throwaway zerorun run, then ask for it explicitly (the store then binds
  // it itself instead of inheriting a socket).
  const Result probe = run({"--", kProg, "env"});
  const size_t at = probe.out.find(" port=");
  REQUIRE(at != std::string::npos);
  const std::string port = probe.out.substr(at + 6, probe.out.find(' ', at + 6) - at - 6);
  REQUIRE(!port.empty());
  REQUIRE(port.find_first_not_of("0123456789") == std::string::npos);
  const Result r = run({"--nproc-per-node=2", "--master-port=" + port, "--timeout-s=50", "--", kProg, "store", "2"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(r.code == 0);
  CHECK(contains(r.out, "store ok rank 1 of 2"));
}

}  // namespace

TEST_CASE("--max-restarts: the job runs again without the rank that was killed, rank 0 included") {
  for (const char* who : {"0", "2"}) {
    CAPTURE(who);
    const Result r = run({"--nproc-per-node=3", "--max-restarts=1", "--report-s=0.2", "--timeout-s=50", "--", kProg, "elastic", who});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(r.code == 0);
    CHECK(contains(r.err, "zerorun: rank " + std::string(who) + " (pid "));
    CHECK(contains(r.err, "zerorun: restart 1 of 1: lost rank(s) " + std::string(who) +
                              " of 3; starting the job again on 2 rank(s)"));
    for (int k = 0; k < 2; ++k) {
      const std::string rk = "[rank " + std::to_string(k) + "] ";
      CHECK(contains(r.out, rk + "attempt 1 of world 2 after 'rank " + std::string(who) + " (pid "));
      CHECK(contains(r.out, rk + "store ok rank " + std::to_string(k) + " of 2 (torchrun, 3 rounds)"));
    }
    CHECK(!contains(r.out, "[rank 2] attempt 1"));
  }
}

TEST_CASE("--max-restarts runs out, and --min-nproc stops the shrinking; each says so") {
  Result r = run({"--nproc-per-node=3", "--max-restarts=1", "--report-s=0.2", "--", kProg, "crash", "0"});
  INFO("stderr:\n" << r.err);
  CHECK(r.code == 128 + SIGKILL);
  CHECK(contains(r.err, "restart 1 of 1: lost rank(s) 0 of 3"));
  CHECK(contains(r.err, "zerorun: no restart left (--max-restarts=1)"));
  r = run({"--nproc-per-node=2", "--max-restarts=3", "--min-nproc=2", "--report-s=0.2", "--", kProg, "crash", "1"});
  CHECK(r.code == 128 + SIGKILL);
  CHECK(contains(r.err, "zerorun: 1 rank(s) left after losing rank(s) 1: fewer than --min-nproc=2; not restarting"));
  CHECK(!contains(r.err, "restart 1"));
}

TEST_CASE("--heartbeat-s: a stopped rank is found, killed and left out") {
  const Result r = run({"--nproc-per-node=2", "--heartbeat-s=1", "--max-restarts=1", "--report-s=0.2", "--timeout-s=50", "--", kProg,
                        "silent", "1"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(r.code == 0);
  CHECK(contains(r.err, "zerorun: rank 1 (pid "));
  CHECK(contains(r.err, "sent no heartbeat for "));
  CHECK(contains(r.err, "(--heartbeat-s): stopped or frozen; killed it"));
  CHECK(contains(r.err, "restart 1 of 1: lost rank(s) 1 of 2; starting the job again on 1 rank(s)"));
  CHECK(contains(r.out, "[rank 0] attempt 1 of world 1 after 'rank 1 (pid "));
  CHECK(r.seconds < 20);
}


TEST_CASE("two nodes with --max-restarts: node 1 loses a rank; both go on as 2 + 1 ranks") {
  const std::string port = std::to_string(zero::testing::free_port());
  const auto node = [&](int k) {
    return std::vector<std::string>{"--nnodes=2", "--node-rank=" + std::to_string(k), "--nproc-per-node=2",
                                    "--master-addr=127.0.0.1", "--master-port=" + port, "--max-restarts=1",
                                    "--report-s=0.2", "--timeout-s=50", "--", kProg, "elastic", "2"};
  };
  ::setenv("ZERO_JOB_TOKEN", "two-node-test", 1);
  Result second;
  std::thread one([&] { second = run(node(1)); });
  const Result first = run(node(0));
  one.join();
  ::unsetenv("ZERO_JOB_TOKEN");
  INFO("node 0 stdout:\n" << first.out << "\nnode 0 stderr:\n" << first.err << "\nnode 1 stdout:\n" << second.out
                          << "\nnode 1 stderr:\n" << second.err);
  CHECK(first.code == 0);
  CHECK(second.code == 0);
  // Node 1 saw its rank 2 killed, claimed the failure and restarts without it.
  CHECK(contains(second.err, "zerorun: rank 2 (pid "));
  CHECK(contains(second.err, "zerorun: restart 1 of 1: lost rank(s) 2 of this node's 2; starting its 1 rank(s) again"));
  // Node 0 stopped its ranks as survivors and starts them all again.
  CHECK(contains(first.err, "zerorun: the job failed elsewhere first (node 1: rank 2 (pid "));
  CHECK(contains(first.err, "zerorun: restart 1 of 1: the job failed elsewhere; starting this node's 2 rank(s) again"));
  CHECK(contains(first.err, "zerorun: attempt 1 runs on node 0: 2 ranks, node 1: 1 rank (3 ranks)"));
  for (int k = 0; k < 2; ++k) {
    CHECK(contains(first.out, "[rank " + std::to_string(k) + "] store ok rank " + std::to_string(k) + " of 3"));
  }
  CHECK(contains(second.out, "[rank 2] attempt 1 of world 3 after 'node 1: rank 2 (pid "));
  CHECK(contains(second.out, "[rank 2] store ok rank 2 of 3"));
}

TEST_CASE("two nodes, --nnodes 1:2: node 1's zerorun killed; node 0 finds it silent and goes on alone") {
  const std::string port = std::to_string(zero::testing::free_port());
  // The join window is long enough for node 1's zerorun to start under a sanitizer on a loaded
  // machine: at 2 s node 0 once formed its first world alone, and node 1, left for a round that
  // never came, was never killed (it timed out instead). Node 0's round after the kill waits the
  // whole window for a second node.
  const auto node = [&](int k) {
    return std::vector<std::string>{"--nnodes=1:2", "--node-rank=" + std::to_string(k), "--nproc-per-node=2",
                                    "--master-addr=127.0.0.1", "--master-port=" + port, "--max-restarts=1",
                                    "--join-timeout-s=8", "--report-s=0.2", "--timeout-s=50", "--", kProg, "elastic", "99"};
  };
  ::setenv("ZERO_JOB_TOKEN", "two-node-test", 1);
  Result second;
  // Node 1's zerorun is killed once both its ranks wait: its ranks die with it, silently for node 0's.
  std::thread one([&] {
    second = run(node(1), 30s, [](pid_t pid) { ::kill(pid, SIGKILL); },
                 [](const std::string& out) { return contains(out, "rank 2 waiting") && contains(out, "rank 3 waiting"); });
  });
  const Result first = run(node(0));
  one.join();
  ::unsetenv("ZERO_JOB_TOKEN");
  INFO("node 0 stdout:\n" << first.out << "\nnode 0 stderr:\n" << first.err);
  CHECK(first.code == 0);
  CHECK(second.code == 128 + SIGKILL);
  CHECK(contains(first.err, "node 1's zerorun stopped answering (lost with its ranks)"));
  CHECK(contains(first.err, "zerorun: attempt 1 runs on node 0: 2 ranks (2 ranks)"));
  for (int k = 0; k < 2; ++k) {
    CHECK(contains(first.out, "[rank " + std::to_string(k) + "] store ok rank " + std::to_string(k) + " of 2"));
  }
}
