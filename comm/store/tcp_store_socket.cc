#include "comm/store/tcp_store_socket.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

namespace zero::comm::net {

void Fd::reset() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

int poll_timeout_ms(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

std::string format_address(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

namespace {

// Waits for `events` on fd; returns 1 when ready, 0 on timeout, -1 on error (errno set).
int wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && Clock::now() < deadline) continue;  // poll rounds; wait out the remainder
    return r > 0 ? 1 : r;
  }
}

}  // namespace

ConnectResult connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline) {
  ConnectResult result;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    result.error = fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(rc));
    return result;
  }
  result.error = "no address";
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      result.error = std::strerror(errno);
      continue;
    }
    int r = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      const int w = wait_fd(fd.get(), POLLOUT, deadline);
      if (w == 0) {
        result.error = "timed out";
        result.timed_out = true;
        break;
      }
      int so_error = 0;
      socklen_t len = sizeof(so_error);
      if (w < 0) {
        so_error = errno;
      } else if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) {
        so_error = errno;
      }
      r = so_error == 0 ? 0 : -1;
      errno = so_error;
    }
    if (r != 0) {
      result.error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    result.fd = std::move(fd);
    result.error.clear();
    break;
  }
  ::freeaddrinfo(list);
  return result;
}

IoResult send_all(int fd, const void* data, size_t n, Clock::time_point deadline, int* err) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int r = wait_fd(fd, POLLOUT, deadline);
      if (r == 0) return IoResult::kTimeout;
      if (r < 0) {
        *err = errno;
        return IoResult::kError;
      }
      continue;
    }
    *err = w < 0 ? errno : EPIPE;
    return (*err == EPIPE || *err == ECONNRESET) ? IoResult::kClosed : IoResult::kError;
  }
  return IoResult::kOk;
}

IoResult recv_all(int fd, void* data, size_t n, Clock::time_point deadline, int* err) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const int w = wait_fd(fd, POLLIN, deadline);
      if (w == 0) return IoResult::kTimeout;
      if (w < 0) {
        *err = errno;
        return IoResult::kError;
      }
      continue;
    }
    *err = errno;
    return errno == ECONNRESET ? IoResult::kClosed : IoResult::kError;
  }
  return IoResult::kOk;
}

}  // namespace zero::comm::net
