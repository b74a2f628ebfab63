#pragma once
// The signals zerorun handles while a job runs. Handlers only record the signal and write a byte
// to a self-pipe, so the supervisor's single poll loop wakes up for a signal (or a child's exit,
// SIGCHLD) the same way it wakes up for output, and does the real work outside the handler.
#include <signal.h>

#include "comm/store/tcp_store_socket.h"

namespace zero::comm {

// Installs the handlers for SIGINT, SIGTERM, SIGHUP and SIGCHLD (and ignores SIGPIPE, so that a
// closed stdout cannot kill zerorun while ranks still run) for its lifetime, then restores the
// previous dispositions. The handlers use process-wide state: one instance at a time.
class LaunchSignals {
 public:
  // Throws IoError when the self-pipe cannot be created.
  LaunchSignals();
  ~LaunchSignals();
  LaunchSignals(const LaunchSignals&) = delete;
  LaunchSignals& operator=(const LaunchSignals&) = delete;

  // Readable when a signal arrived since the last drain_wake(); poll it with the ranks' pipes.
  int wake_fd() const { return wake_read_.get(); }
  void drain_wake();

  // The most recent SIGINT/SIGTERM/SIGHUP when any arrived since the last call, else 0. Signals
  // arriving together count once, as the most recent one.
  int take_new_signal();

 private:
  static constexpr int kHandledCount = 4;  // kHandled in launch_signals.cc

  net::Fd wake_read_, wake_write_;
  int signals_seen_ = 0;
  struct sigaction previous_[kHandledCount] {};
  struct sigaction previous_pipe_ {};
};

}  // namespace zero::comm
