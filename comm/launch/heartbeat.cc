#include "comm/launch/heartbeat.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "base/check.h"

namespace zero::comm {

Heartbeat::Heartbeat(int fd, std::chrono::milliseconds interval) : fd_(fd), interval_(interval) {
  ZERO_CHECK(fd >= 0, "Heartbeat: no socket");
  ZERO_CHECK(interval.count() > 0, "Heartbeat: the interval must be positive, got {} ms", interval.count());
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  ::close(fd_);
}

void Heartbeat::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const char beat = 1;
    // MSG_DONTWAIT: a launcher that reads slowly costs a beat, never a blocked thread; MSG_NOSIGNAL:
    // a launcher that is gone ends the beating instead of raising SIGPIPE in the rank.
    const ssize_t n = ::send(fd_, &beat, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return;
    cv_.wait_for(lock, interval_, [this] { return stop_; });
  }
}

}  // namespace zero::comm
