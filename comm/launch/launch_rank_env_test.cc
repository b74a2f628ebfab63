// Each rank's environment: the rank's own values replace inherited ones, everything else is passed
// through, and only global rank 0 gets the listening socket.
#include "comm/launch/launch_rank_env.h"

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

namespace zero::comm {
namespace {

// NAME -> values, in order (a name set twice would show two values).
std::map<std::string, std::vector<std::string>> by_name(const std::vector<std::string>& env) {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& e : env) {
    const size_t eq = e.find('=');
    REQUIRE(eq != std::string::npos);
    out[e.substr(0, eq)].push_back(e.substr(eq + 1));
  }
  return out;
}

TEST_CASE("a rank's variables replace the inherited ones; the rest passes through") {
  LaunchOptions o;
  o.nnodes = 2;
  o.node_rank = 1;
  o.nproc_per_node = 3;
  o.master_addr = "head";
  const RankRendezvous rv{.token = "t0k", .port = 29500};
  // Every variable zerorun sets, inherited with stale values, among others that must pass through.
  const std::vector<std::string> parent = {
      "PATH=/bin", "RANK=99", "WORLD_SIZE=1", "MASTER_ADDR=x", "MASTER_PORT=1", "LOCAL_RANK=5",
      "LOCAL_WORLD_SIZE=6", "GROUP_RANK=4", "RANKS=keep", "ZERO_JOB_TOKEN=old", "ZERO_STORE_IN_LAUNCHER=0",
      "ZERO_RESTART_COUNT=7", "ZERO_HEARTBEAT_FD=3", "ZERO_NODE_RANK=9",
      "EMPTY=", "A=b=c"};
  const auto env = by_name(rank_environment(o, rv, {}, parent, 2, -1));
  CHECK(global_rank(o, {}, 2) == 5);
  CHECK(global_rank(o, {.first_rank = 3}, 1) == 4);  // numbered by an elastic attempt's plan
  CHECK(env.at("RANK") == std::vector<std::string>{"5"});
  CHECK(env.at("WORLD_SIZE") == std::vector<std::string>{"6"});
  CHECK(env.at("LOCAL_RANK") == std::vector<std::string>{"2"});
  CHECK(env.at("LOCAL_WORLD_SIZE") == std::vector<std::string>{"3"});
  CHECK(env.at("GROUP_RANK") == std::vector<std::string>{"1"});
  CHECK(env.at("ZERO_NODE_RANK") == std::vector<std::string>{"1"});
  CHECK(env.at("MASTER_ADDR") == std::vector<std::string>{"head"});
  CHECK(env.at("MASTER_PORT") == std::vector<std::string>{"29500"});
  CHECK(env.at("ZERO_JOB_TOKEN") == std::vector<std::string>{"t0k"});
  CHECK(env.at("ZERO_STORE_IN_LAUNCHER") == std::vector<std::string>{"1"});
  CHECK(env.at("ZERO_RESTART_COUNT") == std::vector<std::string>{"0"});
  // The first attempt, no heartbeat asked: none of their variables, the inherited ones gone too.
  CHECK(env.count("ZERO_RESTART_FAILED_AT") == 0);
  CHECK(env.count("ZERO_HEARTBEAT_FD") == 0);
  CHECK(env.at("PATH") == std::vector<std::string>{"/bin"});
  CHECK(env.at("RANKS") == std::vector<std::string>{"keep"});
  CHECK(env.at("EMPTY") == std::vector<std::string>{""});
  CHECK(env.at("A") == std::vector<std::string>{"b=c"});
  CHECK(env.at("ZERO_FIRST_WORLD_SIZE") == std::vector<std::string>{"6"});
  CHECK(env.size() == 16);
}

TEST_CASE("a restarted attempt says why, and a watched rank gets its heartbeat socket") {
  LaunchOptions o;
  o.nproc_per_node = 3;  // the attempt's ranks: what is left
  const RankAttempt attempt{.first_world = 4, .restart_count = 1, .failed_at = 1780000000.5, .reason = "rank 3 was killed by signal 9 (SIGKILL)",
                            .heartbeat_interval_ms = 250};
  const auto env = by_name(rank_environment(o, {.token = "t", .port = 4000}, attempt, {}, 1, 11));
  CHECK(env.at("WORLD_SIZE") == std::vector<std::string>{"3"});
  CHECK(env.at("ZERO_RESTART_COUNT") == std::vector<std::string>{"1"});
  CHECK(env.at("ZERO_FIRST_WORLD_SIZE") == std::vector<std::string>{"4"});
  CHECK(env.at("ZERO_RESTART_FAILED_AT") == std::vector<std::string>{"1780000000.500"});
  CHECK(env.at("ZERO_RESTART_REASON") == std::vector<std::string>{"rank 3 was killed by signal 9 (SIGKILL)"});
  CHECK(env.at("ZERO_HEARTBEAT_FD") == std::vector<std::string>{"11"});
  CHECK(env.at("ZERO_HEARTBEAT_INTERVAL_MS") == std::vector<std::string>{"250"});
  // Node 1's local rank 0 is global rank 3.
  o.nnodes = 2;
  o.node_rank = 1;
  CHECK(by_name(rank_environment(o, {}, {}, {}, 0, -1)).at("RANK") == std::vector<std::string>{"3"});
}

}  // namespace
}  // namespace zero::comm
