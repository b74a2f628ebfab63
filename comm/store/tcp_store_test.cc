// TCP store: concurrency, authentication, robustness against malformed clients, deadlines, and
// failure reporting. Raw-socket clients speak the protocol by hand (comm/store/store_wire.h).
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "base/error.h"
#include "comm/store/store_wire.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_socket.h"

namespace zero::comm {
namespace {

using namespace std::chrono_literals;

Bytes b(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string s(const Bytes& v) { return std::string(v.begin(), v.end()); }

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TcpStoreOptions client_options(uint16_t port, const std::string& token = "tok") {
  TcpStoreOptions o;
  o.port = port;
  o.token = token;
  o.timeout = 10s;
  return o;
}

TcpStoreOptions server_options(const std::string& token = "tok") {
  TcpStoreOptions o;
  o.is_server = true;
  o.token = token;
  o.timeout = 10s;
  return o;
}

// A hand-driven connection.
struct Raw {
  explicit Raw(uint16_t port) {
    auto c = net::connect_tcp("127.0.0.1", port, deadline());
    REQUIRE_MESSAGE(c.fd.valid(), c.error);
    fd = std::move(c.fd);
  }
  static net::Clock::time_point deadline() { return net::Clock::now() + 5s; }
  void send(const Bytes& bytes) {
    int err = 0;
    REQUIRE(net::send_all(fd.get(), bytes.data(), bytes.size(), deadline(), &err) == net::IoResult::kOk);
  }
  void hello(const std::string& token = "tok") {
    send(wire::encode_hello(token));
    const Bytes reply = read_frame();
    wire::HelloStatus st;
    std::string msg;
    wire::decode_hello_reply(reply.data(), reply.size(), &st, &msg);
    REQUIRE(st == wire::HelloStatus::kOk);
  }
  Bytes read_frame() {
    uint8_t header[4];
    int err = 0;
    REQUIRE(net::recv_all(fd.get(), header, 4, deadline(), &err) == net::IoResult::kOk);
    Bytes payload(wire::decode_frame_length(header));
    REQUIRE(net::recv_all(fd.get(), payload.data(), payload.size(), deadline(), &err) == net::IoResult::kOk);
    return payload;
  }
  // True when the server closed the connection (EOF or reset) within the deadline.
  bool closed_by_server() {
    uint8_t buf[256];
    const auto dl = deadline();
    for (;;) {
      int err = 0;
      const net::IoResult r = net::recv_all(fd.get(), buf, 1, dl, &err);
      if (r == net::IoResult::kClosed || r == net::IoResult::kError) return true;
      if (r == net::IoResult::kTimeout) return false;
    }
  }
  net::Fd fd;
};

// Waits until the server has `n` open connections (it notices hang-ups asynchronously).
bool wait_connections(const TcpStoreServer& server, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (server.num_connections() == n) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

TEST_CASE("many concurrent clients: counters and a barrier") {
  TcpStoreServer server(server_options());
  constexpr int kClients = 16, kAdds = 40;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      try {
        TcpStore st(client_options(server.port()));
        for (int i = 0; i < kAdds; ++i) st.add("counter", 1);
        st.set("client/" + std::to_string(c), b(std::to_string(c)));
        // Barrier: every client waits for all the others' keys.
        std::vector<std::string> keys;
        for (int k = 0; k < kClients; ++k) keys.push_back("client/" + std::to_string(k));
        st.wait(keys, 20s);
        for (int k = 0; k < kClients; ++k) {
          if (s(st.get(keys[k], 1s)) != std::to_string(k)) ++failures;
        }
      } catch (const std::exception& e) {
        ++failures;
        MESSAGE(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  TcpStore st(client_options(server.port()));
  CHECK(st.add("counter", 0) == kClients * kAdds);
}

TEST_CASE("a get waits for a later set from another client") {
  TcpStore owner(server_options());
  TcpStore other(client_options(owner.port()));
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    other.set("late", b("value"));
  });
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(s(owner.get("late", 10s)) == "value");
  CHECK(std::chrono::steady_clock::now() - t0 >= 90ms);
  setter.join();
}

TEST_CASE("several waiters on one key are all answered, and the server keeps serving meanwhile") {
  TcpStoreServer server(server_options());
  std::vector<std::thread> waiters;
  std::atomic<int> got{0};
  for (int i = 0; i < 5; ++i) {
    waiters.emplace_back([&] {
      TcpStore st(client_options(server.port()));
      if (s(st.get("go", 10s)) == "now") ++got;
    });
  }
  TcpStore st(client_options(server.port()));
  // While five gets wait, other requests are answered at once.
  for (int i = 0; i < 20; ++i) st.add("busy", 1);
  CHECK(st.check({"busy"}));
  st.set("go", b("now"));
  for (auto& t : waiters) t.join();
  CHECK(got == 5);
}

TEST_CASE("wrong token, magic or version is refused with a clear error") {
  TcpStoreServer server(server_options("right"));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of([&] { TcpStore bad(client_options(server.port(), "wrong")); });
  CHECK(msg.find("token mismatch") != std::string::npos);
  CHECK(msg.find(std::to_string(server.port())) != std::string::npos);
  CHECK_THROWS_AS(TcpStore(client_options(server.port(), "wrong")), CommError);
  CHECK_THROWS_AS(TcpStore(client_options(server.port(), "")), CommError);
  // A refusal is final: no retrying until the timeout.
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);

  {
    Raw raw(server.port());
    Bytes hello = wire::encode_hello("right");
    hello[0] ^= 0xff;  // magic
    raw.send(hello);
    const Bytes reply = raw.read_frame();
    wire::HelloStatus st;
    std::string why;
    wire::decode_hello_reply(reply.data(), reply.size(), &st, &why);
    CHECK(st == wire::HelloStatus::kBadMagic);
    CHECK(why.find("magic") != std::string::npos);
    CHECK(raw.closed_by_server());
  }
  {
    Raw raw(server.port());
    Bytes hello = wire::encode_hello("right");
    hello[4] = 99;  // version
    raw.send(hello);
    const Bytes reply = raw.read_frame();
    wire::HelloStatus st;
    std::string why;
    wire::decode_hello_reply(reply.data(), reply.size(), &st, &why);
    CHECK(st == wire::HelloStatus::kBadVersion);
    CHECK(why.find("version 99") != std::string::npos);
    CHECK(raw.closed_by_server());
  }
  TcpStore good(client_options(server.port(), "right"));
  good.set("k", b("v"));
  CHECK(wait_connections(server, 1));
}

TEST_CASE("garbage and absurd lengths drop one connection; the server keeps serving others") {
  TcpStoreServer server(server_options());
  TcpStore good(client_options(server.port()));
  good.set("before", b("1"));

  {  // Garbage instead of a hello.
    Raw raw(server.port());
    raw.send(b("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    CHECK(raw.closed_by_server());
  }
  {  // Authenticated, then an absurd length prefix.
    Raw raw(server.port());
    raw.hello();
    raw.send(Bytes{0xff, 0xff, 0xff, 0xff, 1, 2, 3});
    CHECK(raw.closed_by_server());
  }
  {  // Authenticated, then a zero length.
    Raw raw(server.port());
    raw.hello();
    raw.send(Bytes{0, 0, 0, 0});
    CHECK(raw.closed_by_server());
  }
  {  // A well-framed payload with an unknown op: an error reply, then closed.
    Raw raw(server.port());
    raw.hello();
    raw.send(Bytes{3, 0, 0, 0, 0x77, 0x01, 0x02});
    const Bytes reply = raw.read_frame();
    const wire::Response resp = wire::decode_response(wire::Op::kSet, reply.data(), reply.size());
    CHECK(resp.status == wire::Status::kError);
    CHECK(resp.message.find("unknown op") != std::string::npos);
    CHECK(raw.closed_by_server());
  }
  {  // Random bytes after the hello.
    Raw raw(server.port());
    raw.hello();
    Bytes junk(200);
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 37 + 11);
    raw.send(junk);
    CHECK(raw.closed_by_server());
  }
  {  // A frame cut short, then a hang-up.
    Raw raw(server.port());
    raw.hello();
    raw.send(Bytes{100, 0, 0, 0, 1, 2});
  }
  // A half-open client that never says anything does not block the others either.
  Raw silent(server.port());

  CHECK(s(good.get("before", 1s)) == "1");
  good.set("after", b("2"));
  TcpStore fresh(client_options(server.port()));
  CHECK(s(fresh.get("after", 1s)) == "2");
  CHECK(wait_connections(server, 3));  // good, fresh, silent
}

TEST_CASE("a client hanging up while its get waits is cleaned up") {
  TcpStoreServer server(server_options());
  {
    Raw raw(server.port());
    raw.hello();
    raw.send(wire::frame(wire::encode_request(wire::Request{wire::Op::kGet, {"never"}, {}, {}, 0, 60000})));
    CHECK(wait_connections(server, 1));
  }
  CHECK(wait_connections(server, 0));
  TcpStore st(client_options(server.port()));
  st.set("never", b("now it exists"));  // no answer goes to the closed connection
  CHECK(s(st.get("never", 1s)) == "now it exists");
}

TEST_CASE("a second request while the first waits is a protocol violation") {
  TcpStoreServer server(server_options());
  Raw raw(server.port());
  raw.hello();
  raw.send(wire::frame(wire::encode_request(wire::Request{wire::Op::kGet, {"x"}, {}, {}, 0, 60000})));
  raw.send(wire::frame(wire::encode_request(wire::Request{wire::Op::kAdd, {"y"}, {}, {}, 1, 0})));
  CHECK(raw.closed_by_server());
  TcpStore st(client_options(server.port()));
  CHECK(st.add("z", 1) == 1);
}

TEST_CASE("connecting to a port with no server times out naming the address") {
  // A bound socket that does not listen: connections to its port are refused.
  net::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const uint16_t port = ntohs(addr.sin_port);

  TcpStoreOptions o = client_options(port);
  o.timeout = 300ms;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of([&] { TcpStore st(o); });
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(msg.find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  CHECK(msg.find("refused") != std::string::npos);
  CHECK(took >= 250ms);
  CHECK(took < 5s);
  CHECK_THROWS_AS(TcpStore{o}, TimeoutError);
}

TEST_CASE("the client retries until a late server comes up") {
  // Reserve a port, release it, and start the server on it a little later.
  uint16_t port = 0;
  { port = TcpStoreServer(server_options()).port(); }
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(200ms);
    TcpStoreOptions o = server_options();
    o.port = port;
    server = std::make_unique<TcpStoreServer>(o);
  });
  TcpStore st(client_options(port));
  starter.join();
  st.set("up", b("1"));
  CHECK(s(st.get("up", 1s)) == "1");
}

TEST_CASE("a server that goes away gives CommError naming its address") {
  auto server = std::make_unique<TcpStoreServer>(server_options());
  const uint16_t port = server->port();
  TcpStore st(client_options(port));
  st.set("k", b("v"));
  server.reset();
  const std::string msg = error_of([&] { st.set("k2", b("v")); });
  CHECK(msg.find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  CHECK_THROWS_AS(st.set("k3", b("v")), CommError);  // reconnection refused too
}

TEST_CASE("a server that accepts but never answers: the client deadline names the key") {
  // Speaks the hello, then reads requests and never replies.
  net::Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(listener.get(), 4) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  std::atomic<bool> done{false};
  std::thread mute([&] {
    net::Fd conn(::accept(listener.get(), nullptr, nullptr));
    uint8_t hello[wire::kHelloFixedBytes + 3];
    int err = 0;
    net::recv_all(conn.get(), hello, sizeof(hello), net::Clock::now() + 5s, &err);
    const Bytes ok = wire::frame(wire::encode_hello_reply(wire::HelloStatus::kOk, ""));
    net::send_all(conn.get(), ok.data(), ok.size(), net::Clock::now() + 5s, &err);
    while (!done) std::this_thread::sleep_for(10ms);
  });
  TcpStoreOptions o = client_options(ntohs(addr.sin_port));
  o.timeout = 300ms;
  TcpStore st(o);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of([&] { st.set("stuck_key", b("v")); });
  CHECK(msg.find("stuck_key") != std::string::npos);
  CHECK(msg.find("timed out") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  done = true;
  mute.join();
}

TEST_CASE("the server binds only the given address") {
  // 192.0.2.1 (TEST-NET-1) is not an address of this machine: binding it must fail rather than
  // silently listening on every interface.
  TcpStoreOptions o = server_options();
  o.host = "192.0.2.1";
  const std::string msg = error_of([&] { TcpStoreServer server(o); });
  CHECK(msg.find("192.0.2.1") != std::string::npos);
  CHECK_THROWS_AS(TcpStoreServer{o}, CommError);
}

TEST_CASE("options are validated") {
  TcpStoreOptions o = server_options();
  o.timeout = 0ms;
  CHECK_THROWS_AS(TcpStoreServer{o}, InvalidArgument);
  CHECK(error_of([&] { TcpStoreServer server(o); }).find("timeout") != std::string::npos);
  TcpStoreOptions c = client_options(0);
  CHECK(error_of([&] { TcpStore st(c); }).find("port") != std::string::npos);
  c = client_options(1);
  c.listen_fd = 3;
  CHECK_THROWS_AS(TcpStore{c}, InvalidArgument);
  TcpStoreOptions t = server_options(std::string(5000, 'x'));
  CHECK_THROWS_AS(TcpStoreServer{t}, InvalidArgument);
}

TEST_CASE("oversized keys are refused on the client side") {
  TcpStore st(server_options());
  CHECK_THROWS_AS(st.set(std::string(wire::kMaxKeyBytes + 1, 'k'), b("v")), InvalidArgument);
  st.set("still", b("fine"));
  CHECK(s(st.get("still", 1s)) == "fine");
}

TEST_CASE("an adopted listening socket is served") {
  net::Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(listener.get(), 16) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const uint16_t port = ntohs(addr.sin_port);
  // A client may connect before the server exists: the kernel queues it.
  std::thread early([&] {
    TcpStore st(client_options(port));
    st.set("early", b("1"));
  });
  std::this_thread::sleep_for(50ms);
  TcpStoreOptions o = server_options();
  o.listen_fd = listener.release();
  TcpStore server(o);
  CHECK(server.port() == port);
  CHECK(s(server.get("early", 10s)) == "1");
  early.join();

  // Not a listening socket.
  net::Fd plain(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  TcpStoreOptions bad = server_options();
  bad.listen_fd = plain.release();
  CHECK_THROWS_AS(TcpStoreServer{bad}, InvalidArgument);
}

}  // namespace
}  // namespace zero::comm
