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
  const RankRendezvous rv{.token = "t0k", .port = 29500, .store_listen_fd = 7};
  // Every variable zerorun sets, inherited with stale values, among others that must pass through.
  const std::vector<std::string> parent = {
      "PATH=/bin", "RANK=99", "WORLD_SIZE=1", "MASTER_ADDR=x", "MASTER_PORT=1", "LOCAL_RANK=5",
      "LOCAL_WORLD_SIZE=6", "GROUP_RANK=4", "RANKS=keep", "ZERO_JOB_TOKEN=old", "ZERO_STORE_LISTEN_FD=3",
      "EMPTY=", "A=b=c"};
  const auto env = by_name(rank_environment(o, rv, parent, 2));
  CHECK(global_rank(o, 2) == 5);
  CHECK(env.at("RANK") == std::vector<std::string>{"5"});
  CHECK(env.at("WORLD_SIZE") == std::vector<std::string>{"6"});
  CHECK(env.at("LOCAL_RANK") == std::vector<std::string>{"2"});
  CHECK(env.at("LOCAL_WORLD_SIZE") == std::vector<std::string>{"3"});
  CHECK(env.at("GROUP_RANK") == std::vector<std::string>{"1"});
  CHECK(env.at("MASTER_ADDR") == std::vector<std::string>{"head"});
  CHECK(env.at("MASTER_PORT") == std::vector<std::string>{"29500"});
  CHECK(env.at("ZERO_JOB_TOKEN") == std::vector<std::string>{"t0k"});
  // Not rank 0: no socket, and the inherited value is gone too.
  CHECK(env.count("ZERO_STORE_LISTEN_FD") == 0);
  CHECK(env.at("PATH") == std::vector<std::string>{"/bin"});
  CHECK(env.at("RANKS") == std::vector<std::string>{"keep"});
  CHECK(env.at("EMPTY") == std::vector<std::string>{""});
  CHECK(env.at("A") == std::vector<std::string>{"b=c"});
  CHECK(env.size() == 12);
}

TEST_CASE("only global rank 0 gets the listening socket, and only when there is one") {
  LaunchOptions o;
  o.nproc_per_node = 2;
  const RankRendezvous with_socket{.token = "t", .port = 4000, .store_listen_fd = 9};
  CHECK(by_name(rank_environment(o, with_socket, {}, 0)).at("ZERO_STORE_LISTEN_FD") ==
        std::vector<std::string>{"9"});
  CHECK(by_name(rank_environment(o, with_socket, {}, 1)).count("ZERO_STORE_LISTEN_FD") == 0);
  const RankRendezvous given_port{.token = "t", .port = 4000, .store_listen_fd = -1};
  CHECK(by_name(rank_environment(o, given_port, {"ZERO_STORE_LISTEN_FD=3"}, 0)).count("ZERO_STORE_LISTEN_FD") ==
        0);
  // Node 1's local rank 0 is global rank 2: no socket either.
  o.nnodes = 2;
  o.node_rank = 1;
  CHECK(by_name(rank_environment(o, with_socket, {}, 0)).count("ZERO_STORE_LISTEN_FD") == 0);
  CHECK(by_name(rank_environment(o, with_socket, {}, 0)).at("RANK") == std::vector<std::string>{"2"});
}

}  // namespace
}  // namespace zero::comm
