#include "comm/launch/launch_outcome.h"

#include <fmt/format.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

namespace zero::comm {

namespace {

std::string signal_name(int sig) {
  const char* name = ::sigabbrev_np(sig);
  return name ? name : "?";
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return fmt::format("was killed by signal {} (SIG{})", sig, signal_name(sig));
  }
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

// A rank's status as a shell would report it: its exit status, or 128 + the signal that killed it.
int exit_code_of(int status) {
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace

StopResponse JobOutcome::start_failed() {
  reason_ = StopReason::kStartFailed;
  exit_code_ = 1;
  return {.action = StopResponse::Action::kTearDown, .signal = SIGTERM};
}

StopResponse JobOutcome::signal_received(int sig) {
  if (ending()) {
    return {.action = StopResponse::Action::kKillNow, .message = "got another signal; killing the ranks"};
  }
  reason_ = StopReason::kSignal;
  exit_code_ = 128 + sig;
  return {.action = StopResponse::Action::kTearDown,
          .signal = sig,
          .message = fmt::format("got signal {} (SIG{}); forwarding it to the ranks", sig, signal_name(sig))};
}

StopResponse JobOutcome::rank_exited(int rank, pid_t pid, int status) {
  const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (!failed) return {};
  if (reason_ == StopReason::kNone) {
    reason_ = StopReason::kRankFailed;
    exit_code_ = exit_code_of(status);
    return {.action = StopResponse::Action::kTearDownAfterReport,
            .message = fmt::format("rank {} (pid {}) {}; stopping the other ranks{}", rank, pid,
                                   describe_status(status),
                                   report_s_ > 0 ? fmt::format(" (after up to {} s for them to report)", report_s_)
                                                 : "")};
  }
  // After a rank failure the others' statuses help tell its consequences from other faults; after a
  // signal, the timeout or a failed start the ranks die because zerorun stops them.
  if (reason_ == StopReason::kRankFailed) {
    return {.message = fmt::format("rank {} (pid {}) {}", rank, pid, describe_status(status))};
  }
  return {};
}

StopResponse JobOutcome::deadline_passed() {
  if (ending()) return {};
  reason_ = StopReason::kTimeout;
  exit_code_ = 124;
  return {.action = StopResponse::Action::kTearDown,
          .signal = SIGTERM,
          .message = fmt::format("the job ran past --timeout-s={}; stopping the ranks", timeout_s_)};
}

}  // namespace zero::comm
