// zerorun argument parsing: both flag forms, defaults, and errors that name the flag.
#include <doctest/doctest.h>

#include "base/error.h"
#include "comm/launch/launcher.h"

namespace zero::comm {
namespace {

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_launch_args(args);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("flags in both forms, and the program after --") {
  const LaunchOptions o = parse_launch_args({"--nproc-per-node", "4", "--nnodes=2", "--node-rank=1",
                                             "--master-addr", "head", "--master-port=29500",
                                             "--timeout-s", "2.5", "--grace-s=0.5", "--", "prog",
                                             "--nproc-per-node", "x"});
  CHECK(o.nproc_per_node == 4);
  CHECK(o.nnodes == 2);
  CHECK(o.node_rank == 1);
  CHECK(o.master_addr == "head");
  CHECK(o.master_port == 29500);
  CHECK(o.timeout_s == 2.5);
  CHECK(o.grace_s == 0.5);
  CHECK(o.command == std::vector<std::string>{"prog", "--nproc-per-node", "x"});
}

TEST_CASE("defaults, torchrun spellings, and a program without --") {
  LaunchOptions o = parse_launch_args({"prog", "-v"});
  CHECK(o.nproc_per_node == 1);
  CHECK(o.nnodes == 1);
  CHECK(o.master_addr == "127.0.0.1");
  CHECK(o.master_port == 0);
  CHECK(o.timeout_s == 0);
  CHECK(o.command == std::vector<std::string>{"prog", "-v"});
  o = parse_launch_args({"--nproc_per_node=3", "prog"});
  CHECK(o.nproc_per_node == 3);
  CHECK(parse_launch_args({"--help"}).help);
}

TEST_CASE("errors name the flag") {
  CHECK(error_of({"--nproc-per-node", "abc", "--", "p"}).find("--nproc-per-node: 'abc'") != std::string::npos);
  CHECK(error_of({"--nproc-per-node=0", "p"}).find("--nproc-per-node=0") != std::string::npos);
  CHECK(error_of({"--master-port=70000", "p"}).find("--master-port=70000") != std::string::npos);
  CHECK(error_of({"--timeout-s=-1", "p"}).find("--timeout-s") != std::string::npos);
  CHECK(error_of({"--grace-s=soon", "p"}).find("--grace-s") != std::string::npos);
  CHECK(error_of({"--bogus", "p"}).find("unknown flag '--bogus'") != std::string::npos);
  CHECK(error_of({"-x", "p"}).find("unknown flag '-x'") != std::string::npos);
  CHECK(error_of({"--nnodes"}).find("--nnodes needs a value") != std::string::npos);
  CHECK(error_of({"--nproc-per-node", "2"}).find("no program") != std::string::npos);
  CHECK(error_of({"--"}).find("no program") != std::string::npos);
  CHECK(error_of({"--nnodes=2", "--node-rank=2", "--master-addr=h", "--master-port=1", "p"})
            .find("--node-rank=2") != std::string::npos);
  CHECK(error_of({"--nnodes=2", "--master-addr=h", "p"}).find("--master-port") != std::string::npos);
  CHECK(error_of({"--nnodes=2", "--master-port=5", "p"}).find("--master-addr") != std::string::npos);
  CHECK(error_of({"--master-addr=", "p"}).find("--master-addr") != std::string::npos);
  CHECK(error_of({"--max-restarts=-1", "p"}).find("--max-restarts=-1") != std::string::npos);
  CHECK(error_of({"--nproc-per-node=2", "--min-nproc=3", "p"}).find("--min-nproc=3 is more than --nproc-per-node=2") !=
        std::string::npos);
  CHECK(error_of({"--heartbeat-s=x", "p"}).find("--heartbeat-s") != std::string::npos);
  CHECK(error_of({"--nnodes=3:2", "--master-addr=h", "--master-port=1", "--max-restarts=1", "p"})
            .find("--nnodes 3:2: MIN is more than MAX") != std::string::npos);
  CHECK(error_of({"--nnodes=1:2", "--master-addr=h", "--master-port=1", "p"}).find("a node range needs --max-restarts") !=
        std::string::npos);
}

TEST_CASE("the elastic flags") {
  const LaunchOptions o =
      parse_launch_args({"--nproc-per-node=4", "--max-restarts", "2", "--min-nproc=2", "--heartbeat-s=5", "p"});
  CHECK(o.max_restarts == 2);
  CHECK(o.min_nproc == 2);
  CHECK(o.heartbeat_s == 5);
  const LaunchOptions d = parse_launch_args({"p"});
  CHECK(d.max_restarts == 0);
  CHECK(d.min_nproc == 1);
  CHECK(d.heartbeat_s == 0);
  const LaunchOptions n = parse_launch_args({"--nnodes=1:3", "--master-addr=h", "--master-port=9", "--max-restarts=1",
                                             "--join-timeout-s=4", "p"});
  CHECK(n.nnodes == 3);
  CHECK(n.min_nnodes == 1);
  CHECK(n.join_timeout_s == 4);
  CHECK(parse_launch_args({"--nnodes=2", "--master-addr=h", "--master-port=9", "p"}).min_nnodes == 2);
}

}  // namespace
}  // namespace zero::comm
