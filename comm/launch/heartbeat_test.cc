#include "comm/launch/heartbeat.h"

#include <doctest/doctest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace zero::comm {
namespace {

using namespace std::chrono_literals;

// The bytes that arrive on `fd` within `window`.
int beats_within(int fd, std::chrono::milliseconds window) {
  int n = 0;
  const auto end = std::chrono::steady_clock::now() + window;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[64];
    const ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got <= 0) break;
    n += static_cast<int>(got);
  }
  return n;
}

TEST_CASE("a heartbeat beats at its interval while it lives, and its end closes the socket") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  {
    Heartbeat h(sv[1], 20ms);
    // The first beat at once, then one per 20 ms: at least 5 in 300 ms however loaded the machine.
    const int n = beats_within(sv[0], 300ms);
    CHECK(n >= 5);
    CHECK(n <= 16);
  }
  char c;
  CHECK(::read(sv[0], &c, 1) >= 0);  // drains what is left, then end of stream
  while (::read(sv[0], &c, 1) > 0) {
  }
  CHECK(::read(sv[0], &c, 1) == 0);
  ::close(sv[0]);
}

TEST_CASE("a launcher that is gone ends the beating without a signal") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  ::close(sv[0]);
  Heartbeat h(sv[1], 5ms);  // its sends fail with EPIPE (no SIGPIPE: this test would die)
  std::this_thread::sleep_for(30ms);
}

}  // namespace
}  // namespace zero::comm
