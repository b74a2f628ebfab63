// TcpStoreServer: Boost.Asio on one I/O thread. All state (the table, the waiters, the connections)
// belongs to that thread, so no locks are needed; num_connections() reads an atomic copy.
//
// Per connection: hello (fixed header, then the token) -> request loop (u32 length, payload,
// dispatch). A request that waits (get on an absent key, wait) parks a Waiter registered under each of
// its keys plus a deadline timer; set/add/compare_set wake the waiters of their key. The read loop
// keeps running while a request waits so that a client hanging up is noticed at once; a second
// request arriving before the first is answered is a protocol violation (clients are strictly
// request/response). Any malformed input closes that one connection; others are unaffected.
#include <fcntl.h>
#include <sys/socket.h>

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility> (C++20 mode).
#include <utility>

#include <boost/asio.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include "base/check.h"
#include "base/logging.h"
#include "comm/store/store_table.h"
#include "comm/store/store_wire.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_socket.h"

namespace zero::comm {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

// Most responses waiting to be written on one connection before it counts as a client that does not
// read its replies (and is dropped).
constexpr size_t kMaxQueuedWrites = 16;

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

class ServerConnection;

struct Waiter {
  std::weak_ptr<ServerConnection> conn;
  wire::Op op = wire::Op::kGet;
  std::vector<std::string> keys;
  std::unique_ptr<asio::steady_timer> timer;
  bool done = false;
};

struct TcpStoreServer::Impl {
  explicit Impl(const TcpStoreOptions& o) : options(o), acceptor(io), retry_timer(io) {}

  void start_accept();
  void request_stop();
  void wake(const std::string& key);
  void finish_waiter(const std::shared_ptr<Waiter>& w);  // unregisters; does not answer

  TcpStoreOptions options;
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  uint16_t port = 0;
  bool stopping = false;
  StoreTable table;
  std::map<std::string, std::vector<std::shared_ptr<Waiter>>> waiters;
  std::set<std::shared_ptr<ServerConnection>> connections;
  std::atomic<size_t> connection_count{0};
  std::thread thread;
};

class ServerConnection : public std::enable_shared_from_this<ServerConnection> {
 public:
  ServerConnection(TcpStoreServer::Impl& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), hello_timer_(server.io) {
    boost::system::error_code ec;
    const auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : net::format_address(ep.address().to_string(), ep.port());
    socket_.set_option(tcp::no_delay(true), ec);
  }

  void start() {
    // A peer that connects and never says hello is dropped after the store timeout.
    hello_timer_.expires_after(server_.options.timeout);
    hello_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec && !self->authenticated_) self->drop("no hello before the timeout");
    });
    asio::async_read(socket_, asio::buffer(hello_),
                     [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                       self->on_hello_header(ec);
                     });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    if (pending_) {
      server_.finish_waiter(pending_);
      pending_.reset();
    }
    boost::system::error_code ec;
    hello_timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    server_.connections.erase(shared_from_this());
    server_.connection_count = server_.connections.size();
  }

  // Answers the parked request of this connection.
  void answer_waiter(wire::Op op, const wire::Response& resp) {
    pending_.reset();
    send_response(op, resp);
  }

 private:
  void drop(const std::string& why) {
    if (!closed_ && !server_.stopping) ZERO_LOG_WARN("TCP store: dropping connection from {}: {}", peer_, why);
    close();
  }

  void on_hello_header(const boost::system::error_code& ec) {
    if (ec) return drop_quietly();
    const wire::HelloHeader h = wire::decode_hello_header(hello_.data());
    if (h.magic != wire::kMagic) {
      return refuse(wire::HelloStatus::kBadMagic,
                    fmt::format("bad magic number 0x{:08x} (not a zero TCP store client)", h.magic));
    }
    if (h.version != wire::kVersion) {
      return refuse(wire::HelloStatus::kBadVersion,
                    fmt::format("protocol version {} is not supported (server speaks {})", h.version,
                                wire::kVersion));
    }
    if (h.token_bytes > wire::kMaxTokenBytes) {
      return refuse(wire::HelloStatus::kBadToken, "token mismatch (token too long)");
    }
    body_.resize(h.token_bytes);
    asio::async_read(socket_, asio::buffer(body_),
                     [self = shared_from_this()](const boost::system::error_code& e, size_t) {
                       self->on_token(e);
                     });
  }

  void on_token(const boost::system::error_code& ec) {
    if (ec) return drop_quietly();
    const std::string token(body_.begin(), body_.end());
    if (!constant_time_equal(token, server_.options.token)) {
      return refuse(wire::HelloStatus::kBadToken, "token mismatch (check ZERO_JOB_TOKEN)");
    }
    authenticated_ = true;
    hello_timer_.cancel();
    queue_write(wire::frame(wire::encode_hello_reply(wire::HelloStatus::kOk, "")));
    read_header();
  }

  void refuse(wire::HelloStatus status, const std::string& why) {
    if (!server_.stopping) ZERO_LOG_WARN("TCP store: refusing connection from {}: {}", peer_, why);
    close_after_write_ = true;
    queue_write(wire::frame(wire::encode_hello_reply(status, why)));
  }

  void read_header() {
    asio::async_read(socket_, asio::buffer(header_),
                     [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                       self->on_header(ec);
                     });
  }

  void on_header(const boost::system::error_code& ec) {
    if (ec) return drop_quietly();
    uint32_t n = 0;
    try {
      n = wire::decode_frame_length(header_.data());
      body_.resize(n);
    } catch (const std::exception& e) {
      return drop(e.what());
    }
    asio::async_read(socket_, asio::buffer(body_),
                     [self = shared_from_this()](const boost::system::error_code& e, size_t) {
                       self->on_body(e);
                     });
  }

  void on_body(const boost::system::error_code& ec) {
    if (ec) return drop_quietly();
    if (pending_) return drop("a second request arrived before the first was answered");
    wire::Request req;
    try {
      req = wire::decode_request(body_.data(), body_.size());
    } catch (const std::exception& e) {
      // Say why before closing, so that a buggy client gets a readable error.
      wire::Response resp;
      resp.status = wire::Status::kError;
      resp.message = e.what();
      if (!server_.stopping) ZERO_LOG_WARN("TCP store: dropping connection from {}: {}", peer_, e.what());
      close_after_write_ = true;
      send_response(wire::Op::kSet, resp);
      return;
    }
    body_.clear();
    body_.shrink_to_fit();  // do not keep a large value's buffer per idle connection
    dispatch(req);
    if (!closed_ && !close_after_write_) read_header();
  }

  void dispatch(const wire::Request& req) {
    wire::Response resp;
    auto& table = server_.table;
    const std::string& key = req.keys.empty() ? std::string() : req.keys[0];
    try {
      switch (req.op) {
        case wire::Op::kSet:
          table.set(key, req.value);
          server_.wake(key);
          break;
        case wire::Op::kAdd:
          resp.number = table.add(key, req.delta);
          server_.wake(key);
          break;
        case wire::Op::kCompareSet:
          resp.value = table.compare_set(key, req.value, req.desired);
          server_.wake(key);
          break;
        case wire::Op::kDelete:
          resp.flag = table.erase(key);
          break;
        case wire::Op::kCheck:
          resp.flag = table.contains_all(req.keys);
          break;
        case wire::Op::kGet:
        case wire::Op::kWait:
          if (table.contains_all(req.keys)) {
            if (req.op == wire::Op::kGet) resp.value = *table.find(key);
          } else if (req.timeout_ms == 0) {
            resp.status = wire::Status::kTimeout;
            resp.missing = table.missing(req.keys);
          } else {
            return park(req);
          }
          break;
      }
    } catch (const InvalidArgument& e) {
      resp = wire::Response{};
      resp.status = wire::Status::kInvalid;
      resp.message = e.what();
    }
    send_response(req.op, resp);
  }

  void park(const wire::Request& req) {
    auto w = std::make_shared<Waiter>();
    w->conn = weak_from_this();
    w->op = req.op;
    w->keys = req.keys;
    w->timer = std::make_unique<asio::steady_timer>(server_.io);
    // The same clamp as the other stores (deadline_after): 0..30 days.
    const auto timeout = std::chrono::milliseconds(
        std::min<uint64_t>(req.timeout_ms, uint64_t{30} * 24 * 3600 * 1000));
    w->timer->expires_after(timeout);
    pending_ = w;
    // Registered under every key (not only the missing ones): a key deleted and set again while the
    // request waits must still wake it.
    for (const auto& k : w->keys) {
      auto& list = server_.waiters[k];
      if (std::find(list.begin(), list.end(), w) == list.end()) list.push_back(w);
    }
    w->timer->async_wait([w, &server = server_](const boost::system::error_code& ec) {
      if (ec || w->done) return;
      server.finish_waiter(w);
      if (auto conn = w->conn.lock()) {
        wire::Response resp;
        resp.status = wire::Status::kTimeout;
        resp.missing = server.table.missing(w->keys);
        conn->answer_waiter(w->op, resp);
      }
    });
  }

  void send_response(wire::Op op, const wire::Response& resp) {
    try {
      queue_write(wire::frame(wire::encode_response(op, resp)));
    } catch (const std::exception& e) {
      drop(e.what());
    }
  }

  void queue_write(Bytes frame) {
    if (closed_) return;
    if (writes_.size() >= kMaxQueuedWrites) return drop("client does not read its replies");
    writes_.push_back(std::move(frame));
    if (writes_.size() == 1) write_front();
  }

  void write_front() {
    asio::async_write(socket_, asio::buffer(writes_.front()),
                      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                        self->on_written(ec);
                      });
  }

  void on_written(const boost::system::error_code& ec) {
    if (closed_) return;
    if (ec) return drop_quietly();
    writes_.pop_front();
    if (!writes_.empty()) return write_front();
    if (close_after_write_) close();
  }

  // A peer hanging up (or the server stopping) is normal: no warning.
  void drop_quietly() { close(); }

  TcpStoreServer::Impl& server_;
  tcp::socket socket_;
  asio::steady_timer hello_timer_;
  std::string peer_;
  std::array<uint8_t, wire::kHelloFixedBytes> hello_{};
  std::array<uint8_t, 4> header_{};
  Bytes body_;
  std::deque<Bytes> writes_;
  std::shared_ptr<Waiter> pending_;
  bool authenticated_ = false;
  bool close_after_write_ = false;
  bool closed_ = false;
};

void TcpStoreServer::Impl::start_accept() {
  acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (stopping) return;
    if (ec) {
      // Out of descriptors or a transient failure: try again shortly instead of spinning.
      ZERO_LOG_WARN("TCP store: accept failed: {}", ec.message());
      retry_timer.expires_after(std::chrono::milliseconds(50));
      retry_timer.async_wait([this](const boost::system::error_code& e) {
        if (!e && !stopping) start_accept();
      });
      return;
    }
    auto conn = std::make_shared<ServerConnection>(*this, std::move(socket));
    connections.insert(conn);
    connection_count = connections.size();
    conn->start();
    start_accept();
  });
}

void TcpStoreServer::Impl::wake(const std::string& key) {
  const auto it = waiters.find(key);
  if (it == waiters.end()) return;
  const auto list = it->second;  // copy: finishing a waiter edits the lists
  for (const auto& w : list) {
    if (w->done || !table.contains_all(w->keys)) continue;
    finish_waiter(w);
    if (auto conn = w->conn.lock()) {
      wire::Response resp;
      if (w->op == wire::Op::kGet) resp.value = *table.find(w->keys[0]);
      conn->answer_waiter(w->op, resp);
    }
  }
}

void TcpStoreServer::Impl::finish_waiter(const std::shared_ptr<Waiter>& w) {
  if (w->done) return;
  w->done = true;
  w->timer->cancel();
  for (const auto& k : w->keys) {
    const auto it = waiters.find(k);
    if (it == waiters.end()) continue;
    auto& list = it->second;
    list.erase(std::remove(list.begin(), list.end(), w), list.end());
    if (list.empty()) waiters.erase(it);
  }
}

void TcpStoreServer::Impl::request_stop() {
  stopping = true;
  boost::system::error_code ec;
  acceptor.close(ec);
  retry_timer.cancel();
  const auto conns = connections;  // close() edits the set
  for (const auto& c : conns) c->close();
  waiters.clear();
}

namespace {

// Adopts an already listening socket, checking that it is one.
void adopt_listen_fd(tcp::acceptor& acceptor, int fd) {
  net::Fd owned(fd);
  int accepting = 0;
  socklen_t len = sizeof(accepting);
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || !accepting) {
    ZERO_THROW(InvalidArgument, "TcpStoreOptions.listen_fd={} is not a listening socket", fd);
  }
  sockaddr_storage addr{};
  socklen_t alen = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0 ||
      (addr.ss_family != AF_INET && addr.ss_family != AF_INET6)) {
    ZERO_THROW(InvalidArgument, "TcpStoreOptions.listen_fd={} is not a TCP socket", fd);
  }
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // inherited from the launcher; children must not keep it
  boost::system::error_code ec;
  acceptor.assign(addr.ss_family == AF_INET ? tcp::v4() : tcp::v6(), owned.release(), ec);
  if (ec) ZERO_THROW(CommError, "TCP store: cannot adopt listen_fd={}: {}", fd, ec.message());
}

void bind_listen(asio::io_context& io, tcp::acceptor& acceptor, const std::string& host,
                 uint16_t port) {
  boost::system::error_code ec;
  tcp::resolver resolver(io);
  const auto results = resolver.resolve(host, std::to_string(port),
                                        tcp::resolver::numeric_service, ec);
  if (ec) ZERO_THROW(CommError, "TCP store: cannot resolve bind address '{}': {}", host, ec.message());
  std::string last = "no address";
  for (const auto& entry : results) {
    const tcp::endpoint ep = entry.endpoint();
    acceptor.open(ep.protocol(), ec);
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(ep, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) return;
    last = fmt::format("{}: {}", net::format_address(ep.address().to_string(), ep.port()), ec.message());
    boost::system::error_code ignored;
    acceptor.close(ignored);
  }
  ZERO_THROW(CommError, "TCP store: cannot listen on {}: {}", net::format_address(host, port), last);
}

}  // namespace

TcpStoreServer::TcpStoreServer(const TcpStoreOptions& options)
    : impl_(std::make_unique<Impl>(options)) {
  if (options.timeout <= std::chrono::milliseconds(0)) {
    ZERO_THROW(InvalidArgument, "TcpStoreOptions.timeout must be positive, got {} ms", options.timeout.count());
  }
  if (options.token.size() > wire::kMaxTokenBytes) {
    ZERO_THROW(InvalidArgument, "TcpStoreOptions.token is {} bytes (max {})", options.token.size(),
               wire::kMaxTokenBytes);
  }
  if (options.listen_fd >= 0) {
    adopt_listen_fd(impl_->acceptor, options.listen_fd);
  } else {
    if (options.host.empty()) ZERO_THROW(InvalidArgument, "TcpStoreOptions.host is empty");
    bind_listen(impl_->io, impl_->acceptor, options.host, options.port);
  }
  boost::system::error_code ec;
  impl_->port = impl_->acceptor.local_endpoint(ec).port();
  impl_->start_accept();
  impl_->thread = std::thread([impl = impl_.get()] {
    for (;;) {
      try {
        impl->io.run();
        return;
      } catch (const std::exception& e) {
        // A handler threw something unexpected (say bad_alloc); keep serving the others.
        ZERO_LOG_ERROR("TCP store server: {}", e.what());
      }
    }
  });
}

TcpStoreServer::~TcpStoreServer() {
  // Close everything on the I/O thread; run() returns once no operation is left.
  asio::post(impl_->io, [impl = impl_.get()] { impl->request_stop(); });
  impl_->thread.join();
}

uint16_t TcpStoreServer::port() const { return impl_->port; }

size_t TcpStoreServer::num_connections() const { return impl_->connection_count.load(); }

}  // namespace zero::comm
