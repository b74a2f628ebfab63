#pragma once
// TCP rendezvous store. One TcpStoreServer (Boost.Asio, its own I/O thread) serves any number of
// TcpStore clients; usually rank 0 owns the server (TcpStoreOptions::is_server) and every rank,
// rank 0 included, talks to it as a client. Protocol: comm/store/store_wire.h.
//
// Security: every connection opens with a hello carrying the job token; the server refuses a
// connection whose token, magic number or protocol version is wrong, and the client raises
// CommError saying why ("token mismatch", ...). The server binds only the given host.
//
// Waiting: get() and wait() wait on the server (it keeps waiters per key and answers them when the
// key is set, without blocking its thread); the server answers "timeout" after the request's timeout,
// and the client additionally holds a socket deadline slightly past it in case the server hangs.
//
// Threads: one TcpStore may be shared by threads; calls are serialized on its one connection (a
// thread waiting in get() holds the connection, so a second thread's call waits for it, within that
// call's own timeout). Use one client per thread when they wait on each other.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "comm/store/store.h"
#include "comm/store/store_wire.h"

namespace zero::comm {

struct TcpStoreOptions {
  // Server: the address to bind (all interfaces only when asked with "0.0.0.0" or "::").
  // Client: the address to connect to.
  std::string host = "127.0.0.1";
  // Server: 0 picks a free port (see port()). Client: the server's port.
  uint16_t port = 0;
  bool is_server = false;
  // Job token; must match between server and clients (both empty is allowed).
  std::string token;
  // Default deadline of connect (with retries) and of calls that take no timeout of their own.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Server only: an already bound, listening TCP socket to serve on instead of binding host:port.
  // The server takes ownership (closes it). zerorun hands one to rank 0 (ZERO_STORE_LISTEN_FD) so
  // that a free port can be chosen without a race.
  int listen_fd = -1;
  // Server only: when the store is destroyed while an exception unwinds (its rank is failing), it
  // waits up to this long for the other clients to hang up first. The failure reports the other
  // ranks read after their own deadline live here (comm/gloo/failure_report.h); a failing host
  // that left at once would take them along ("the store could not tell which ranks reached it").
  // A normal exit does not wait.
  std::chrono::milliseconds linger_on_failure{0};
};

class ServerConnection;  // defined in tcp_store_server.cc

class TcpStoreServer {
 public:
  // Binds (or adopts listen_fd) and starts serving. Throws InvalidArgument for bad options and
  // CommError when the address cannot be bound.
  explicit TcpStoreServer(const TcpStoreOptions& options);
  ~TcpStoreServer();  // stops serving and closes every connection
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const;
  // Number of connections currently open (for tests and diagnostics).
  size_t num_connections() const;

 private:
  friend class ServerConnection;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TcpStore : public Store {
 public:
  // Client: connects, retrying refused connections until options.timeout (then TimeoutError), and
  // says hello (CommError when refused). With options.is_server it first starts a TcpStoreServer
  // on options.host:options.port and connects to it.
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // The server's port.
  uint16_t port() const { return port_; }
  // "host:port" of the server, as named in errors.
  const std::string& address() const { return address_; }

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool delete_key(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  class Connection;

  // Sends one request and returns the server's kOk response; maps timeouts, refusals and broken
  // connections to TimeoutError / InvalidArgument / CommError. `server_wait` is the server-side
  // wait of get/wait (0 for the others).
  wire::Response call(const wire::Request& req, std::chrono::milliseconds server_wait);

  TcpStoreOptions options_;
  std::unique_ptr<TcpStoreServer> server_;
  std::string connect_host_;
  uint16_t port_ = 0;
  std::string address_;
  // Calls are serialized by a "busy" flag rather than std::timed_mutex: waiting for it must respect
  // the call's deadline, and ThreadSanitizer (GCC 12) does not intercept the clocklock that
  // timed_mutex::try_lock_until uses.
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool busy_ = false;
  std::unique_ptr<Connection> connection_;  // null after a failure; the next call reconnects
};

}  // namespace zero::comm
