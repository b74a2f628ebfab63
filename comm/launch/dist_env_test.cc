// Environment parsing for every launcher (torchrun/zerorun, Slurm, Open MPI), bad values, Slurm node
// lists, and connect_store with ranks in threads.
#include "comm/launch/dist_env.h"

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_socket.h"

namespace zero::comm {
namespace {

using namespace std::chrono_literals;

const char* const kVars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "ZERO_JOB_TOKEN", "ZERO_STORE_IN_LAUNCHER", "GROUP_RANK", "ZERO_RESTART_COUNT", "ZERO_RESTART_FAILED_AT",
    "ZERO_RESTART_REASON", "ZERO_HEARTBEAT_FD", "ZERO_HEARTBEAT_INTERVAL_MS", "ZERO_FIRST_WORLD_SIZE", "ZERO_NODE_RANK",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
    "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
};

// Clears every launcher variable for one test and restores the previous values afterwards.
class Env {
 public:
  Env() {
    (void)zero::logger();  // created now, before any thread could read the environment
    for (const char* v : kVars) {
      if (const char* old = std::getenv(v)) saved_[v] = old;
      ::unsetenv(v);
    }
  }
  ~Env() {
    for (const char* v : kVars) ::unsetenv(v);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }
  Env& set(const char* name, const std::string& value) {
    ::setenv(name, value.c_str(), 1);
    return *this;
  }
  Env& unset(const char* name) {
    ::unsetenv(name);
    return *this;
  }

 private:
  std::map<std::string, std::string> saved_;
};

std::string error_of_read() {
  try {
    read_dist_env();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

void torchrun(Env& e, int rank, int world) {
  e.set("RANK", std::to_string(rank)).set("WORLD_SIZE", std::to_string(world));
  e.set("MASTER_ADDR", "10.1.2.3").set("MASTER_PORT", "29501");
}

TEST_CASE("no launcher: a single process") {
  Env e;
  const DistEnv d = read_dist_env();
  CHECK(d.source == "default");
  CHECK(d.rank == 0);
  CHECK(d.world_size == 1);
  CHECK(d.local_rank == 0);
  CHECK(d.local_world_size == 1);
  CHECK(d.master_addr == "127.0.0.1");
  CHECK(d.token.empty());
  CHECK_FALSE(d.store_in_launcher);
}

TEST_CASE("torchrun / zerorun variables") {
  Env e;
  torchrun(e, 5, 8);
  e.set("LOCAL_RANK", "1").set("LOCAL_WORLD_SIZE", "4").set("ZERO_JOB_TOKEN", "s3cret");
  DistEnv d = read_dist_env();
  CHECK(d.source == "torchrun");
  CHECK(d.rank == 5);
  CHECK(d.world_size == 8);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 4);
  CHECK(d.master_addr == "10.1.2.3");
  CHECK(d.master_port == 29501);
  CHECK(d.token == "s3cret");
  CHECK(d.node == 1);  // rank 5 of nodes of 4
  e.set("GROUP_RANK", "3");
  CHECK(read_dist_env().node == 3);
  e.set("ZERO_NODE_RANK", "2");  // zerorun's, which a restart keeps
  CHECK(read_dist_env().node == 2);
  e.unset("GROUP_RANK").unset("ZERO_NODE_RANK");

  // Without the local variables: one node.
  e.unset("LOCAL_RANK").unset("LOCAL_WORLD_SIZE");
  d = read_dist_env();
  CHECK(d.local_rank == 5);
  CHECK(d.local_world_size == 8);
  CHECK(d.node == 0);

  // A single process needs no master.
  Env single;
  single.set("RANK", "0").set("WORLD_SIZE", "1");
  d = read_dist_env();
  CHECK(d.world_size == 1);
  CHECK(d.master_port == 0);
}

TEST_CASE("torchrun variables: bad values name the variable and the value") {
  struct Case {
    std::map<std::string, std::string> vars;
    std::vector<std::string> expect;
  };
  const std::map<std::string, std::string> good = {
      {"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}};
  const std::vector<Case> cases = {
      {{{"RANK", "abc"}}, {"RANK='abc'", "not an integer"}},
      {{{"RANK", "1x"}}, {"RANK='1x'"}},
      {{{"RANK", ""}}, {"RANK=''"}},
      {{{"RANK", "4"}}, {"RANK=4", "WORLD_SIZE=4"}},
      {{{"RANK", "-1"}}, {"RANK=-1"}},
      {{{"WORLD_SIZE", "0"}}, {"WORLD_SIZE=0"}},
      {{{"WORLD_SIZE", "99999999999999999999"}}, {"WORLD_SIZE='99999999999999999999'"}},
      {{{"MASTER_PORT", "70000"}}, {"MASTER_PORT=70000"}},
      {{{"MASTER_PORT", "0"}}, {"MASTER_PORT=0"}},
      {{{"MASTER_PORT", "http"}}, {"MASTER_PORT='http'"}},
      {{{"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}, {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"}},
      {{{"LOCAL_WORLD_SIZE", "5"}}, {"LOCAL_WORLD_SIZE=5", "WORLD_SIZE=4"}},
  };
  for (const auto& c : cases) {
    Env e;
    for (const auto& [k, v] : good) e.set(k.c_str(), v);
    for (const auto& [k, v] : c.vars) e.set(k.c_str(), v);
    const std::string msg = error_of_read();
    CAPTURE(msg);
    for (const auto& x : c.expect) CHECK(msg.find(x) != std::string::npos);
  }
  {
    Env e;
    e.set("RANK", "1").set("WORLD_SIZE", "2").set("MASTER_ADDR", "h");
    CHECK(error_of_read().find("MASTER_PORT is not set") != std::string::npos);
  }
  {
    Env e;
    e.set("RANK", "1").set("WORLD_SIZE", "2").set("MASTER_PORT", "1");
    CHECK(error_of_read().find("MASTER_ADDR is not set") != std::string::npos);
  }
  {
    Env e;
    e.set("RANK", "1");
    CHECK(error_of_read().find("WORLD_SIZE is not set") != std::string::npos);
  }
}

TEST_CASE("Slurm variables") {
  Env e;
  e.set("SLURM_PROCID", "5").set("SLURM_NTASKS", "8").set("SLURM_LOCALID", "1");
  e.set("SLURM_NTASKS_PER_NODE", "4").set("SLURM_JOB_NODELIST", "node[03-05,07]");
  e.set("SLURM_JOB_ID", "123456").set("ZERO_JOB_TOKEN", "t");
  DistEnv d = read_dist_env();
  CHECK(d.source == "slurm");
  CHECK(d.rank == 5);
  CHECK(d.world_size == 8);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 4);
  CHECK(d.master_addr == "node03");
  CHECK(d.master_port == 29500 + 456);
  CHECK(d.node == 0);  // SLURM_NODEID unset
  CHECK(d.token == "t");

  // MASTER_ADDR and MASTER_PORT override; the step's node list wins over the job's.
  e.set("MASTER_PORT", "40000");
  CHECK(read_dist_env().master_port == 40000);
  e.set("SLURM_STEP_NODELIST", "gpu[10-11]");
  CHECK(read_dist_env().master_addr == "gpu10");
  e.set("MASTER_ADDR", "head");
  CHECK(read_dist_env().master_addr == "head");
  e.unset("MASTER_ADDR").unset("SLURM_STEP_NODELIST");

  // Tasks per node derived from SLURM_TASKS_PER_NODE and the node id.
  e.unset("SLURM_NTASKS_PER_NODE");
  e.set("SLURM_NTASKS", "7").set("SLURM_PROCID", "6").set("SLURM_LOCALID", "0");
  e.set("SLURM_TASKS_PER_NODE", "2(x3),1").set("SLURM_NODEID", "3");
  d = read_dist_env();
  CHECK(d.local_world_size == 1);
  e.set("SLURM_NODEID", "1").set("SLURM_PROCID", "3").set("SLURM_LOCALID", "1");
  CHECK(read_dist_env().local_world_size == 2);

  // ...or from the task and node counts.
  e.unset("SLURM_TASKS_PER_NODE").unset("SLURM_NODEID");
  e.set("SLURM_NTASKS", "8").set("SLURM_NNODES", "2");
  CHECK(read_dist_env().local_world_size == 4);
  e.set("SLURM_NTASKS", "7");
  CHECK(error_of_read().find("SLURM_NNODES=2") != std::string::npos);
  e.unset("SLURM_NNODES");
  CHECK(error_of_read().find("SLURM_NTASKS_PER_NODE") != std::string::npos);
}

TEST_CASE("Slurm variables: bad values") {
  auto base = [](Env& e) {
    e.set("SLURM_PROCID", "0").set("SLURM_NTASKS", "4").set("SLURM_LOCALID", "0");
    e.set("SLURM_NTASKS_PER_NODE", "4").set("SLURM_JOB_NODELIST", "n1");
  };
  {
    Env e;
    base(e);
    e.set("SLURM_PROCID", "4");
    const std::string msg = error_of_read();
    CHECK(msg.find("SLURM_PROCID=4") != std::string::npos);
    CHECK(msg.find("SLURM_NTASKS=4") != std::string::npos);
  }
  {
    Env e;
    base(e);
    e.set("SLURM_NTASKS", "four");
    CHECK(error_of_read().find("SLURM_NTASKS='four'") != std::string::npos);
  }
  {
    Env e;
    base(e);
    e.unset("SLURM_LOCALID");
    CHECK(error_of_read().find("SLURM_LOCALID is not set") != std::string::npos);
  }
  {
    Env e;
    base(e);
    e.set("SLURM_JOB_NODELIST", "node[03-05");
    const std::string msg = error_of_read();
    CHECK(msg.find("SLURM_JOB_NODELIST='node[03-05'") != std::string::npos);
  }
  {
    Env e;
    base(e);
    e.unset("SLURM_JOB_NODELIST");
    CHECK(error_of_read().find("SLURM_JOB_NODELIST") != std::string::npos);
  }
  {
    Env e;
    base(e);
    e.set("MASTER_PORT", "123456");
    CHECK(error_of_read().find("MASTER_PORT=123456") != std::string::npos);
  }
}

TEST_CASE("Slurm node lists: the first host") {
  CHECK(slurm_first_host("host1") == "host1");
  CHECK(slurm_first_host("host1,host2") == "host1");
  CHECK(slurm_first_host("node[03-05,07]") == "node03");
  CHECK(slurm_first_host("node[07,03-05]") == "node07");
  CHECK(slurm_first_host("node[3]") == "node3");
  CHECK(slurm_first_host("gpu[1-2]-ib,cpu3") == "gpu1-ib");
  CHECK(slurm_first_host("rack[1-2]-n[001-004]") == "rack1-n001");
  CHECK(slurm_first_host("a.b.c") == "a.b.c");
  CHECK(slurm_first_host("node[0100-0200],x[1]") == "node0100");
  CHECK_THROWS_AS(slurm_first_host(""), InvalidArgument);
  CHECK_THROWS_AS(slurm_first_host("node["), InvalidArgument);
  CHECK_THROWS_AS(slurm_first_host("node]1"), InvalidArgument);
  CHECK_THROWS_AS(slurm_first_host("n[a-b]"), InvalidArgument);
  CHECK_THROWS_AS(slurm_first_host("n[]"), InvalidArgument);
  CHECK_THROWS_AS(slurm_first_host(",n1"), InvalidArgument);
}

TEST_CASE("Slurm tasks-per-node lists") {
  CHECK(slurm_tasks_on_node("4", 0) == 4);
  CHECK(slurm_tasks_on_node("2(x3),1", 0) == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 2) == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 3) == 1);
  CHECK(slurm_tasks_on_node("1,3(x2)", 2) == 3);
  CHECK_THROWS_AS(slurm_tasks_on_node("2(x3),1", 4), InvalidArgument);
  CHECK_THROWS_AS(slurm_tasks_on_node("two", 0), InvalidArgument);
  CHECK_THROWS_AS(slurm_tasks_on_node("2(x3", 0), InvalidArgument);
  CHECK_THROWS_AS(slurm_tasks_on_node("2(xa)", 0), InvalidArgument);
  CHECK_THROWS_AS(slurm_tasks_on_node("", 0), InvalidArgument);
}

TEST_CASE("Open MPI variables") {
  Env e;
  e.set("OMPI_COMM_WORLD_RANK", "3").set("OMPI_COMM_WORLD_SIZE", "4");
  e.set("OMPI_COMM_WORLD_LOCAL_RANK", "1").set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  e.set("MASTER_ADDR", "mpi-head").set("MASTER_PORT", "5555");
  DistEnv d = read_dist_env();
  CHECK(d.source == "openmpi");
  CHECK(d.rank == 3);
  CHECK(d.world_size == 4);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 2);
  CHECK(d.master_addr == "mpi-head");
  CHECK(d.master_port == 5555);
  CHECK(d.node == 1);

  // mpirun inside a Slurm allocation: the MPI variables win over the daemons' SLURM_PROCID.
  e.set("SLURM_PROCID", "0").set("SLURM_NTASKS", "1").set("SLURM_LOCALID", "0");
  CHECK(read_dist_env().source == "openmpi");
  // torchrun-style variables win over both.
  torchrun(e, 1, 2);
  CHECK(read_dist_env().source == "torchrun");
  e.unset("RANK").unset("WORLD_SIZE");

  e.unset("MASTER_PORT");
  CHECK(error_of_read().find("MASTER_PORT is not set") != std::string::npos);
  e.set("MASTER_PORT", "5555").unset("MASTER_ADDR");
  CHECK(error_of_read().find("MASTER_ADDR is not set") != std::string::npos);
  e.set("MASTER_ADDR", "h").set("OMPI_COMM_WORLD_RANK", "x");
  CHECK(error_of_read().find("OMPI_COMM_WORLD_RANK='x'") != std::string::npos);
  e.set("OMPI_COMM_WORLD_RANK", "0").set("OMPI_COMM_WORLD_LOCAL_RANK", "2");
  CHECK(error_of_read().find("OMPI_COMM_WORLD_LOCAL_RANK=2") != std::string::npos);
}

TEST_CASE("zerorun's variables: the store in the launcher, the restart, the heartbeat") {
  Env e;
  torchrun(e, 0, 2);
  DistEnv d = read_dist_env();
  CHECK_FALSE(d.store_in_launcher);
  CHECK(d.restart_count == 0);
  CHECK(d.restart_failed_at == 0);
  CHECK(d.restart_reason.empty());
  CHECK(d.heartbeat_fd == -1);
  CHECK(d.first_world_size == 2);
  e.set("ZERO_FIRST_WORLD_SIZE", "4");
  CHECK(read_dist_env().first_world_size == 4);
  e.set("ZERO_STORE_IN_LAUNCHER", "1").set("ZERO_RESTART_COUNT", "2").set("ZERO_RESTART_FAILED_AT", "1780000000.25");
  e.set("ZERO_RESTART_REASON", "rank 1 was killed").set("ZERO_HEARTBEAT_FD", "9").set("ZERO_HEARTBEAT_INTERVAL_MS", "500");
  d = read_dist_env();
  CHECK(d.store_in_launcher);
  CHECK(d.restart_count == 2);
  CHECK(d.restart_failed_at == 1780000000.25);
  CHECK(d.restart_reason == "rank 1 was killed");
  CHECK(d.heartbeat_fd == 9);
  CHECK(d.heartbeat_interval_ms == 500);
  e.set("ZERO_STORE_IN_LAUNCHER", "yes");
  CHECK(error_of_read().find("ZERO_STORE_IN_LAUNCHER='yes'") != std::string::npos);
  e.set("ZERO_STORE_IN_LAUNCHER", "1").set("ZERO_RESTART_FAILED_AT", "-3");
  CHECK(error_of_read().find("ZERO_RESTART_FAILED_AT='-3'") != std::string::npos);
  e.unset("ZERO_RESTART_FAILED_AT").unset("ZERO_HEARTBEAT_INTERVAL_MS");
  CHECK(error_of_read().find("ZERO_HEARTBEAT_INTERVAL_MS is not set") != std::string::npos);
}

// A listening loopback socket; returns its port.
net::Fd listening_socket(uint16_t* port) {
  net::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(fd.get(), 64) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  *port = ntohs(addr.sin_port);
  return fd;
}

TEST_CASE("connect_store: argument checks") {
  DistEnv d;
  d.world_size = 2;
  d.rank = 2;
  CHECK_THROWS_AS(connect_store(d, 1s), InvalidArgument);
  d.rank = 1;
  d.master_port = 0;
  CHECK_THROWS_AS(connect_store(d, 1s), InvalidArgument);
  d.master_port = 1;
  CHECK_THROWS_AS(connect_store(d, 0ms), InvalidArgument);
}

TEST_CASE("connect_store: world size 1 is an in-process store") {
  DistEnv d;
  auto store = connect_store(d, 1s);
  store->set_string("k", "v");
  CHECK(store->get_string("k", 1s) == "v");
  CHECK(dynamic_cast<TcpStore*>(store.get()) == nullptr);
}

// Four ranks in threads meet at `port`: rank 0 hosts the server there unless the launcher does
// (in_launcher: a server the test holds). Checks every rank's view and the tickets.
void rendezvous_four(uint16_t port, bool in_launcher) {
  constexpr int kWorld = 4;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kWorld);
  std::vector<int64_t> tickets(kWorld);
  std::vector<std::shared_ptr<Store>> stores(kWorld);
  for (int r = kWorld - 1; r >= 0; --r) {  // rank 0 last: the others connect before it serves
    threads.emplace_back([&, r] {
      try {
        DistEnv d;
        d.rank = r;
        d.world_size = kWorld;
        d.local_rank = r;
        d.local_world_size = kWorld;
        d.master_port = port;
        d.token = "job";
        d.source = "test";
        d.store_in_launcher = in_launcher;
        stores[r] = connect_store(d, 10s);
        tickets[r] = stores[r]->add("arrived", 1);
        stores[r]->set_string("rank/" + std::to_string(r), std::to_string(r * r));
        std::vector<std::string> keys;
        for (int k = 0; k < kWorld; ++k) keys.push_back("rank/" + std::to_string(k));
        stores[r]->wait(keys, 10s);
        for (int k = 0; k < kWorld; ++k) {
          if (stores[r]->get_string(keys[k], 1s) != std::to_string(k * k)) errors[r] = "wrong value";
        }
        stores[r]->add("done", 1);
        if (r == 0 && !in_launcher) {
          // Rank 0 hosts the server: it leaves only after everyone is done.
          while (stores[0]->add("done", 0) < kWorld) std::this_thread::sleep_for(1ms);
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    CHECK(errors[r] == "");
  }
  std::sort(tickets.begin(), tickets.end());
  CHECK(tickets == std::vector<int64_t>{1, 2, 3, 4});
  // A rank with the wrong token is refused.
  DistEnv bad;
  bad.rank = 1;
  bad.world_size = kWorld;
  bad.master_port = port;
  bad.token = "other job";
  try {
    connect_store(bad, 5s);
    FAIL("expected CommError");
  } catch (const CommError& e) {
    CHECK(std::string(e.what()).find("token mismatch") != std::string::npos);
  }
  stores.clear();
}

TEST_CASE("connect_store: four ranks in threads rendezvous through rank 0's server") {
  uint16_t port = 0;
  listening_socket(&port);  // a port free a moment ago (closed here); rank 0 binds it again
  rendezvous_four(port, false);
}

TEST_CASE("connect_store: four ranks in threads rendezvous through the launcher's server, rank 0 a client") {
  TcpStoreServer launcher({.host = "127.0.0.1", .port = 0, .is_server = true, .token = "job"});
  rendezvous_four(launcher.port(), true);
}

}  // namespace
}  // namespace zero::comm
