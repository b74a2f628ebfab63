#include "comm/launch/launch_signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "base/check.h"

namespace zero::comm {

namespace {

// Process-wide because a signal handler cannot reach an object; LaunchSignals owns them while it lives.
std::atomic<int> g_forward_signal{0};
std::atomic<int> g_signal_count{0};
int g_wake_fd = -1;

constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

void on_signal(int sig) {
  const int saved = errno;
  if (sig != SIGCHLD) {
    g_forward_signal.store(sig);
    g_signal_count.fetch_add(1);
  }
  if (g_wake_fd >= 0) {
    const char byte = 0;
    [[maybe_unused]] const ssize_t n = ::write(g_wake_fd, &byte, 1);
  }
  errno = saved;
}

}  // namespace

LaunchSignals::LaunchSignals() {
  static_assert(std::size(kHandled) == kHandledCount);
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    ZERO_THROW(IoError, "zerorun: pipe: {}", std::strerror(errno));
  }
  wake_read_ = net::Fd(wake[0]);
  wake_write_ = net::Fd(wake[1]);
  g_wake_fd = wake_write_.get();
  g_forward_signal = 0;
  g_signal_count = 0;
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int i = 0; i < kHandledCount; ++i) ::sigaction(kHandled[i], &sa, &previous_[i]);
  // A closed stdout must not kill the launcher while ranks still run.
  struct sigaction ign{};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, &previous_pipe_);
}

LaunchSignals::~LaunchSignals() {
  for (int i = 0; i < kHandledCount; ++i) ::sigaction(kHandled[i], &previous_[i], nullptr);
  ::sigaction(SIGPIPE, &previous_pipe_, nullptr);
  g_wake_fd = -1;
}

void LaunchSignals::drain_wake() {
  char drain[64];
  while (::read(wake_read_.get(), drain, sizeof(drain)) > 0) {
  }
}

int LaunchSignals::take_new_signal() {
  const int count = g_signal_count.load();
  if (count <= signals_seen_) return 0;
  signals_seen_ = count;
  return g_forward_signal.load();
}

}  // namespace zero::comm
