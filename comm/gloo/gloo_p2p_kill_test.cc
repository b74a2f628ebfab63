// A peer process killed (SIGKILL) while a transfer with it is pending: the surviving rank's wait
// ends at once with CommError naming the peer, not at its timeout. Rank 1 is a forked child (forked
// before this process starts any thread) that joins through a TCP store served here.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/store/tcp_store.h"

namespace zero::comm {
namespace {

using namespace std::chrono_literals;

constexpr auto kTimeout = 20s;

GlooOptions options() {
  GlooOptions o;
  o.timeout = kTimeout;
  o.failure_report_grace = 0ms;
  return o;
}

// Rank 1: joins, posts a receive rank 0 never sends, says so, and waits to be killed.
[[noreturn]] void child(int port_pipe) {
  uint16_t port = 0;
  if (read(port_pipe, &port, sizeof port) != sizeof port) _exit(2);
  try {
    TcpStoreOptions so;
    so.port = port;
    so.timeout = kTimeout;
    auto store = std::make_shared<TcpStore>(so);
    auto comm = make_gloo_communicator(store, 1, 2, options());
    std::vector<uint8_t> in(1 << 20);
    WorkHandle r = comm->recv(in.data(), in.size(), DType::kUInt8, 0);
    store->set("child/posted", Bytes{1});
    std::this_thread::sleep_for(kTimeout);  // killed long before
  } catch (...) {
  }
  _exit(3);
}

TEST_CASE("a peer process killed with a transfer pending ends the waiting rank at once, naming it") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[1]);
    child(fds[0]);
  }
  close(fds[0]);
  TcpStoreOptions server_options;
  server_options.is_server = true;
  server_options.timeout = kTimeout;
  TcpStoreServer server(server_options);
  const uint16_t port = server.port();
  REQUIRE(write(fds[1], &port, sizeof port) == sizeof port);
  close(fds[1]);

  TcpStoreOptions so;
  so.port = port;
  so.timeout = kTimeout;
  auto store = std::make_shared<TcpStore>(so);
  auto comm = make_gloo_communicator(store, 0, 2, options());
  comm->set_call_label("stage 1 act");
  std::vector<uint8_t> in(1 << 20);
  WorkHandle r = comm->recv(in.data(), in.size(), DType::kUInt8, 1);
  store->get("child/posted", kTimeout);
  REQUIRE(kill(pid, SIGKILL) == 0);
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    r->wait();
    FAIL_CHECK("the receive completed");
  } catch (const CommError& e) {
    error = e.what();
  }
  CHECK(std::chrono::steady_clock::now() - start < kTimeout / 2);
  CAPTURE(error);
  CHECK(error.find("gloo rank 0: recv(uint8, 1048576, from rank 1) #0 [stage 1 act] failed: the "
                   "connection to rank 1 broke") != std::string::npos);
  // Later calls fail at once.
  CHECK_THROWS_AS(comm->send(in.data(), 1, DType::kUInt8, 1), CommError);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status));
}

}  // namespace
}  // namespace zero::comm
