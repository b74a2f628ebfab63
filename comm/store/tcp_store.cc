// TcpStore client: one POSIX socket with per-call deadlines (comm/store/tcp_store_socket.h), serialized by
// a timed mutex so that waiting for another thread's call also respects the caller's timeout.
#include "comm/store/tcp_store.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

#include "base/check.h"
#include "base/logging.h"
#include "comm/store/store_table.h"
#include "comm/store/tcp_store_socket.h"

namespace zero::comm {

namespace {

// How long past a server-side wait the client keeps its socket open for the server's answer.
constexpr std::chrono::milliseconds kReplyGrace{2000};

using Clock = net::Clock;

std::string connect_host_for(const TcpStoreOptions& o) {
  // A server bound to every interface is reached over loopback by its own client.
  if (o.is_server && o.host == "0.0.0.0") return "127.0.0.1";
  if (o.is_server && o.host == "::") return "::1";
  return o.host;
}

}  // namespace

// One authenticated connection to the server.
class TcpStore::Connection {
 public:
  // Connects and says hello. Throws CommError when the server refuses (no retry makes sense), or
  // returns nullptr with *error set when the connection could not be made (worth retrying).
  static std::unique_ptr<Connection> open(const std::string& host, uint16_t port,
                                          const std::string& address, const std::string& token,
                                          Clock::time_point deadline, std::string* error) {
    net::ConnectResult c = net::connect_tcp(host, port, deadline);
    if (!c.fd.valid()) {
      *error = c.error;
      return nullptr;
    }
    auto conn = std::unique_ptr<Connection>(new Connection(std::move(c.fd)));
    const Bytes hello = wire::encode_hello(token);
    int err = 0;
    if (net::send_all(conn->fd_.get(), hello.data(), hello.size(), deadline, &err) !=
        net::IoResult::kOk) {
      *error = "connection closed during hello";
      return nullptr;
    }
    Bytes reply;
    const net::IoResult r = conn->read_frame(&reply, deadline, &err);
    if (r != net::IoResult::kOk) {
      *error = r == net::IoResult::kTimeout ? "no hello reply (timed out)"
                                            : "connection closed during hello";
      return nullptr;
    }
    wire::HelloStatus status = wire::HelloStatus::kOk;
    std::string message;
    wire::decode_hello_reply(reply.data(), reply.size(), &status, &message);
    if (status != wire::HelloStatus::kOk) {
      ZERO_THROW(CommError, "TCP store at {} refused the connection: {}", address, message);
    }
    return conn;
  }

  net::IoResult write(const Bytes& frame, Clock::time_point deadline, int* err) {
    return net::send_all(fd_.get(), frame.data(), frame.size(), deadline, err);
  }

  // Reads one frame's payload. A bad length throws ProtocolError.
  net::IoResult read_frame(Bytes* payload, Clock::time_point deadline, int* err) {
    uint8_t header[4];
    net::IoResult r = net::recv_all(fd_.get(), header, 4, deadline, err);
    if (r != net::IoResult::kOk) return r;
    payload->resize(wire::decode_frame_length(header));
    return net::recv_all(fd_.get(), payload->data(), payload->size(), deadline, err);
  }

 private:
  explicit Connection(net::Fd fd) : fd_(std::move(fd)) {}
  net::Fd fd_;
};

TcpStore::TcpStore(const TcpStoreOptions& options) : options_(options) {
  if (options_.timeout <= std::chrono::milliseconds(0)) {
    ZERO_THROW(InvalidArgument, "TcpStoreOptions.timeout must be positive, got {} ms",
               options_.timeout.count());
  }
  if (options_.host.empty() && options_.listen_fd < 0) {
    ZERO_THROW(InvalidArgument, "TcpStoreOptions.host is empty");
  }
  if (options_.token.size() > wire::kMaxTokenBytes) {
    ZERO_THROW(InvalidArgument, "TcpStoreOptions.token is {} bytes (max {})", options_.token.size(),
               wire::kMaxTokenBytes);
  }
  if (!options_.is_server && options_.listen_fd >= 0) {
    ZERO_THROW(InvalidArgument, "TcpStoreOptions.listen_fd is for a server (is_server=false)");
  }
  if (options_.is_server) {
    server_ = std::make_unique<TcpStoreServer>(options_);
    port_ = server_->port();
  } else {
    if (options_.port == 0) ZERO_THROW(InvalidArgument, "TcpStoreOptions.port must be set for a client");
    port_ = options_.port;
  }
  connect_host_ = connect_host_for(options_);
  if (options_.is_server && options_.listen_fd >= 0 && options_.host.empty()) connect_host_ = "127.0.0.1";
  address_ = net::format_address(connect_host_, port_);

  // The server may not be up yet (other ranks start at their own pace): retry until the timeout.
  const auto deadline = deadline_after(options_.timeout);
  std::string error;
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    connection_ = Connection::open(connect_host_, port_, address_, options_.token, deadline, &error);
    if (connection_) break;
    const auto now = Clock::now();
    if (now >= deadline) {
      ZERO_THROW(TimeoutError, "timed out after {} ms connecting to the TCP store at {} (last error: {})",
                 options_.timeout.count(), address_, error);
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

TcpStore::~TcpStore() {
  if (server_ && std::uncaught_exceptions() > 0 && options_.linger_on_failure.count() > 0) {
    // This connection is one; the others are the ranks still running or failing.
    const auto until = std::chrono::steady_clock::now() + options_.linger_on_failure;
    while (server_->num_connections() > 1 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  connection_.reset();  // before the server, so it sees a clean hang-up
  server_.reset();
}

wire::Response TcpStore::call(const wire::Request& req, std::chrono::milliseconds server_wait) {
  const char* op = wire::op_name(req.op);
  const std::string keys = format_keys(req.keys);
  const bool waits = req.op == wire::Op::kGet || req.op == wire::Op::kWait;
  const auto limit = waits ? std::clamp(server_wait, std::chrono::milliseconds(0),
                                        std::chrono::milliseconds(std::chrono::hours(24 * 30))) +
                                 kReplyGrace
                           : options_.timeout;
  const auto deadline = deadline_after(limit);

  {
    std::unique_lock<std::mutex> lock(gate_mu_);
    if (!gate_cv_.wait_until(lock, deadline, [&] { return !busy_; })) {
      ZERO_THROW(TimeoutError,
                 "TCP store {}({}) timed out after {} ms waiting for another thread's call on the "
                 "same client (server {})",
                 op, keys, limit.count(), address_);
    }
    busy_ = true;
  }
  // Frees the connection for the next caller however this call ends.
  struct Release {
    TcpStore* self;
    ~Release() {
      {
        std::lock_guard<std::mutex> lock(self->gate_mu_);
        self->busy_ = false;
      }
      self->gate_cv_.notify_one();
    }
  } release{this};
  if (!connection_) {
    // The previous call broke the connection: one reconnection attempt, no retries.
    std::string error;
    connection_ = Connection::open(connect_host_, port_, address_, options_.token, deadline, &error);
    if (!connection_) {
      ZERO_THROW(CommError, "TCP store {}({}): cannot reconnect to the server at {}: {}", op, keys,
                 address_, error);
    }
  }

  const Bytes frame = wire::frame(wire::encode_request(req));
  int err = 0;
  Bytes payload;
  net::IoResult r = connection_->write(frame, deadline, &err);
  try {
    if (r == net::IoResult::kOk) r = connection_->read_frame(&payload, deadline, &err);
  } catch (const wire::ProtocolError& e) {
    connection_.reset();
    ZERO_THROW(CommError, "TCP store {}({}): bad reply from the server at {}: {}", op, keys, address_,
               e.what());
  }
  if (r != net::IoResult::kOk) {
    connection_.reset();  // the stream position is unknown now
    if (r == net::IoResult::kTimeout) {
      ZERO_THROW(TimeoutError, "TCP store {}({}) timed out after {} ms without a reply from the server at {}",
                 op, keys, limit.count(), address_);
    }
    ZERO_THROW(CommError, "TCP store {}({}): connection to the server at {} lost: {}", op, keys, address_,
               r == net::IoResult::kClosed ? std::string("closed by the server")
                                           : std::string(std::strerror(err)));
  }

  wire::Response resp;
  try {
    resp = wire::decode_response(req.op, payload.data(), payload.size());
  } catch (const wire::ProtocolError& e) {
    connection_.reset();
    ZERO_THROW(CommError, "TCP store {}({}): bad reply from the server at {}: {}", op, keys, address_,
               e.what());
  }
  switch (resp.status) {
    case wire::Status::kOk:
      return resp;
    case wire::Status::kTimeout:
      ZERO_THROW(TimeoutError, "TCP store {}: timed out after {} ms waiting for key(s) {} (server {})", op,
                 server_wait.count(), format_keys(resp.missing), address_);
    case wire::Status::kInvalid:
      throw InvalidArgument(resp.message);
    case wire::Status::kError:
      connection_.reset();  // the server closes after an error
      ZERO_THROW(CommError, "TCP store {}({}): the server at {} answered: {}", op, keys, address_,
                 resp.message);
  }
  ZERO_THROW(CommError, "TCP store {}: unknown reply status", op);
}

namespace {
wire::Request make(wire::Op op, const std::string& key) {
  wire::Request r;
  r.op = op;
  r.keys.push_back(key);
  return r;
}
}  // namespace

void TcpStore::set(const std::string& key, const Bytes& value) {
  wire::Request r = make(wire::Op::kSet, key);
  r.value = value;
  call(r, {});
}

Bytes TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  wire::Request r = make(wire::Op::kGet, key);
  r.timeout_ms = static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0));
  return call(r, timeout).value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  wire::Request r = make(wire::Op::kAdd, key);
  r.delta = delta;
  return call(r, {}).number;
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  wire::Request r = make(wire::Op::kCompareSet, key);
  r.value = expected;
  r.desired = desired;
  return call(r, {}).value;
}

bool TcpStore::delete_key(const std::string& key) {
  return call(make(wire::Op::kDelete, key), {}).flag;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  wire::Request r;
  r.op = wire::Op::kCheck;
  r.keys = keys;
  return call(r, {}).flag;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  wire::Request r;
  r.op = wire::Op::kWait;
  r.keys = keys;
  r.timeout_ms = static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0));
  call(r, timeout);
}

}  // namespace zero::comm
