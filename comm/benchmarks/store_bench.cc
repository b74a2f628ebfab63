// TCP store request latency over loopback, against the bound of a raw TCP ping-pong of the same
// socket setup measured in the same run (one request = one round trip, so the ping-pong is what the
// store cannot beat).
//
//   bazel run -c opt //comm/benchmarks:store_bench -- [seconds per row, default 1]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_socket.h"

namespace {

using namespace zero::comm;
using Clock = std::chrono::steady_clock;

// Round trips per second of `threads` clients each bouncing 16 bytes off an echo thread per client.
double ping_pong_rate(int threads, double seconds) {
  net::Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::listen(listener.get(), 64);
  socklen_t len = sizeof(addr);
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  const uint16_t port = ntohs(addr.sin_port);

  std::atomic<long> total{0};
  std::vector<std::thread> echo, clients;
  for (int t = 0; t < threads; ++t) {
    echo.emplace_back([&] {
      net::Fd conn(::accept(listener.get(), nullptr, nullptr));
      const int one = 1;  // as the store server does
      ::setsockopt(conn.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      char buf[16];
      int err = 0;
      const auto far = Clock::now() + std::chrono::hours(1);
      while (net::recv_all(conn.get(), buf, sizeof(buf), far, &err) == net::IoResult::kOk) {
        if (net::send_all(conn.get(), buf, sizeof(buf), far, &err) != net::IoResult::kOk) break;
      }
    });
  }
  for (int t = 0; t < threads; ++t) {
    clients.emplace_back([&] {
      const Clock::time_point end =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
      auto c = net::connect_tcp("127.0.0.1", port, Clock::now() + std::chrono::seconds(5));
      char buf[16] = {};
      int err = 0;
      long n = 0;
      while (Clock::now() < end) {
        net::send_all(c.fd.get(), buf, sizeof(buf), end + std::chrono::seconds(5), &err);
        net::recv_all(c.fd.get(), buf, sizeof(buf), end + std::chrono::seconds(5), &err);
        ++n;
      }
      total += n;
    });
  }
  for (auto& t : clients) t.join();
  for (auto& t : echo) t.join();
  return static_cast<double>(total) / seconds;
}

// Store add() calls per second of `threads` clients, each with its own TcpStore connection.
double store_rate(int threads, double seconds) {
  TcpStoreOptions so;
  so.token = "bench";
  TcpStoreServer server(so);
  std::atomic<long> total{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < threads; ++t) {
    clients.emplace_back([&, t] {
      TcpStoreOptions o;
      o.port = server.port();
      o.token = "bench";
      TcpStore store(o);
      const std::string key = "counter/" + std::to_string(t);
      const Clock::time_point end =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
      long n = 0;
      while (Clock::now() < end) {
        store.add(key, 1);
        ++n;
      }
      total += n;
    });
  }
  for (auto& t : clients) t.join();
  return static_cast<double>(total) / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
  std::printf("# TCP store add() round trips over loopback vs a raw 16-byte TCP ping-pong (same run)\n");
  std::printf("%8s %14s %12s %16s %12s %8s\n", "clients", "store ops/s", "store us/op", "ping-pong ops/s",
              "ping us/op", "ratio");
  for (int threads : {1, 2, 4, 8}) {
    const double bound = ping_pong_rate(threads, seconds);
    const double store = store_rate(threads, seconds);
    std::printf("%8d %14.0f %12.1f %16.0f %12.1f %8.2f\n", threads, store, 1e6 * threads / store, bound,
                1e6 * threads / bound, store / bound);
  }
  return 0;
}
