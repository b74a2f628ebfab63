// A rank program for zerorun_test, launched by zerorun. Modes:
//   env                 print the launcher variables (stdout) and a line on stderr; a line written in
//                       several pieces checks that lines stay whole
//   fail R CODE         rank R exits with CODE after 200 ms; the others sleep 60 s
//   crash R             rank R kills itself with SIGKILL; the others sleep 60 s
//   stubborn R CODE DIR like fail, but the others ignore SIGTERM (and say so with files in DIR)
//   sleep               every rank sleeps 60 s, printing "rank R got signal S" when signalled
//   orphan              rank 0 leaves a child sleeping 60 s (holding the output pipe) and exits 0
//   longline N          rank 0 prints one line of N 'x' characters
//   store ROUNDS        connect_store(read_dist_env()) and run ROUNDS barrier rounds of adds/waits
//   elastic R           first attempt: rank R kills itself with SIGKILL, the others sleep; a restarted
//                       attempt says what it was told and runs the store's rounds
//   silent R            with zerorun's heartbeat: first attempt, rank R stops itself (SIGSTOP), the
//                       others sleep; a restarted attempt says so and exits 0
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "comm/launch/dist_env.h"
#include "comm/launch/heartbeat.h"

namespace {

using namespace std::chrono_literals;

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

int rank() { return std::atoi(env_or("RANK", "-1")); }

void sleep_long() {
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(100ms);
}

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

int run_store(int rounds) {
  const zero::comm::DistEnv env = zero::comm::read_dist_env();
  auto store = zero::comm::connect_store(env, std::chrono::seconds(30));
  const std::string me = std::to_string(env.rank);
  for (int round = 0; round < rounds; ++round) {
    const std::string r = std::to_string(round);
    const int64_t ticket = store->add("round/" + r + "/count", env.rank + 1);
    store->set_string("round/" + r + "/rank/" + me, std::to_string(ticket));
    // Barrier: wait for every rank's key of this round.
    std::vector<std::string> keys;
    for (int k = 0; k < env.world_size; ++k) keys.push_back("round/" + r + "/rank/" + std::to_string(k));
    store->wait(keys, std::chrono::seconds(30));
    const int64_t total = store->add("round/" + r + "/count", 0);
    const int64_t expect = static_cast<int64_t>(env.world_size) * (env.world_size + 1) / 2;
    if (total != expect) {
      std::printf("round %d: count %lld, expected %lld\n", round, static_cast<long long>(total),
                  static_cast<long long>(expect));
      return 1;
    }
  }
  // Rank 0 hosts the store: it leaves last.
  store->set_string("done/" + me, "1");
  if (env.rank == 0) {
    std::vector<std::string> keys;
    for (int k = 0; k < env.world_size; ++k) keys.push_back("done/" + std::to_string(k));
    store->wait(keys, std::chrono::seconds(30));
  }
  std::printf("store ok rank %d of %d (%s, %d rounds)\n", env.rank, env.world_size, env.source.c_str(),
              rounds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return 2;
  const std::string mode = args[0];
  try {
    if (mode == "env") {
      std::printf("rank=%s world=%s local=%s/%s group=%s addr=%s port=%s token=%s store_in_launcher=%s\n",
                  env_or("RANK", "-"), env_or("WORLD_SIZE", "-"), env_or("LOCAL_RANK", "-"),
                  env_or("LOCAL_WORLD_SIZE", "-"), env_or("GROUP_RANK", "-"),
                  env_or("MASTER_ADDR", "-"), env_or("MASTER_PORT", "-"),
                  env_or("ZERO_JOB_TOKEN", "-"), env_or("ZERO_STORE_IN_LAUNCHER", "-"));
      std::fflush(stdout);
      std::printf("first half ");
      std::fflush(stdout);
      std::this_thread::sleep_for(30ms);
      std::printf("second half %d\n", rank());
      std::fflush(stdout);
      std::fprintf(stderr, "to stderr from %d\n", rank());
      std::printf("no newline at the end %d", rank());
      return 0;
    }
    if (mode == "fail" || mode == "crash") {
      const int who = std::stoi(args.at(1));
      if (rank() == who) {
        std::this_thread::sleep_for(200ms);
        if (mode == "crash") ::raise(SIGKILL);
        return std::stoi(args.at(2));
      }
      sleep_long();
      return 0;
    }
    if (mode == "stubborn") {
      // The failing rank waits until every other rank ignores SIGTERM (a file per rank in DIR), so
      // that the teardown really needs its SIGKILL.
      const int who = std::stoi(args.at(1));
      const std::string dir = args.at(3);
      const int world = std::atoi(env_or("WORLD_SIZE", "1"));
      if (rank() != who) {
        ::signal(SIGTERM, SIG_IGN);
        std::fclose(std::fopen((dir + "/ready." + std::to_string(rank())).c_str(), "w"));
        sleep_long();
        return 0;
      }
      for (int i = 0; i < 2000; ++i) {
        int ready = 0;
        for (int k = 0; k < world; ++k) {
          ready += ::access((dir + "/ready." + std::to_string(k)).c_str(), F_OK) == 0 ? 1 : 0;
        }
        if (ready == world - 1) break;
        std::this_thread::sleep_for(10ms);
      }
      return std::stoi(args.at(2));
    }
    if (mode == "sleep") {
      ::signal(SIGTERM, on_signal);
      ::signal(SIGINT, on_signal);
      std::printf("rank %d sleeping\n", rank());
      std::fflush(stdout);
      while (g_signal == 0) std::this_thread::sleep_for(10ms);
      std::printf("rank %d got signal %d\n", rank(), static_cast<int>(g_signal));
      return 0;
    }
    if (mode == "orphan") {
      if (rank() == 0 && ::fork() == 0) {
        ::execlp("sleep", "sleep", "60", static_cast<char*>(nullptr));
        ::_exit(1);
      }
      return 0;
    }
    if (mode == "longline") {
      if (rank() == 0) std::printf("%s\n", std::string(std::stoul(args.at(1)), 'x').c_str());
      return 0;
    }
    if (mode == "store") return run_store(std::stoi(args.at(1)));
    if (mode == "elastic" || mode == "silent") {
      const zero::comm::DistEnv env = zero::comm::read_dist_env();
      std::unique_ptr<zero::comm::Heartbeat> beat;
      if (env.heartbeat_fd >= 0) {
        beat = std::make_unique<zero::comm::Heartbeat>(env.heartbeat_fd,
                                                       std::chrono::milliseconds(env.heartbeat_interval_ms));
      }
      if (env.restart_count > 0) {
        std::printf("attempt %d of world %d after '%s' (%.1f s ago)\n", env.restart_count, env.world_size,
                    env.restart_reason.c_str(),
                    std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                        env.restart_failed_at);
        std::fflush(stdout);
        return mode == "elastic" ? run_store(3) : 0;
      }
      if (env.rank == std::stoi(args.at(1))) {
        std::this_thread::sleep_for(300ms);
        ::raise(mode == "elastic" ? SIGKILL : SIGSTOP);
      }
      std::printf("rank %d waiting\n", env.rank);
      std::fflush(stdout);
      sleep_long();
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 2;
}
