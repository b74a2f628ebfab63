#pragma once
// Blocking-with-deadline TCP socket helpers (POSIX) for the store client, the launcher and tests.
// Sockets are non-blocking underneath; every operation polls until its deadline, so no call can hang.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace zero::comm::net {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor; move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

struct ConnectResult {
  Fd fd;                // valid on success
  std::string error;    // why it failed ("Connection refused", a resolver message, "timed out")
  bool timed_out = false;
};

// Resolves host and connects (TCP_NODELAY, non-blocking, close-on-exec) before the deadline.
ConnectResult connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline);

enum class IoResult { kOk, kTimeout, kClosed, kError };

// Sends or receives exactly n bytes before the deadline. On kError, *err holds errno.
IoResult send_all(int fd, const void* data, size_t n, Clock::time_point deadline, int* err);
IoResult recv_all(int fd, void* data, size_t n, Clock::time_point deadline, int* err);

// "host:port", with brackets around IPv6 literals.
std::string format_address(const std::string& host, uint16_t port);

// Milliseconds left until the deadline for poll(): 0 when past, capped at INT_MAX.
int poll_timeout_ms(Clock::time_point deadline);

}  // namespace zero::comm::net
