#pragma once
// A rank's heartbeat to its launcher (zerorun --heartbeat-s, docs/reliability.md): a thread that
// sends one byte every interval over the socket zerorun passed (ZERO_HEARTBEAT_FD). zerorun takes a
// rank whose bytes stop for --heartbeat-s as gone, kills it and ends (or restarts) the job: the
// case of a process that is alive but no longer runs (SIGSTOP, a frozen node, swapped to death),
// which no exit status and no closed socket reveals, and whose peers would otherwise wait in their
// collectives until the collective timeout.
//
// It beats from its own thread, so a long computation or a slow collective of the training thread
// does not read as silence; those are the collectives' timeouts' to catch. init_process_group
// starts one when the launcher asks (comm/launch/process_group.h).
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace zero::comm {

class Heartbeat {
 public:
  // Takes `fd` (a connected stream socket; closed by the destructor) and beats into it every
  // `interval`, the first beat at once. A send that fails (the launcher gone) ends the beating.
  Heartbeat(int fd, std::chrono::milliseconds interval);
  ~Heartbeat();  // stops the thread
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  void run();

  const int fd_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zero::comm
