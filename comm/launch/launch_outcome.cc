#include "comm/launch/launch_outcome.h"

#include <fmt/format.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include <algorithm>

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

void JobOutcome::lose(int rank) {
  if (std::find(lost_.begin(), lost_.end(), rank) == lost_.end()) lost_.push_back(rank);
}

StopResponse JobOutcome::first_failure(int rank, const std::string& what, int exit_code) {
  reason_ = StopReason::kRankFailed;
  exit_code_ = exit_code;
  failure_ = what;
  lose(rank);
  return {.action = StopResponse::Action::kTearDownAfterReport,
          .message = fmt::format("{}; stopping the other ranks{}", what,
                                 report_s_ > 0 ? fmt::format(" (after up to {} s for them to report)", report_s_) : "")};
}

StopResponse JobOutcome::rank_exited(int rank, pid_t pid, int status) {
  const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (!failed) return {};
  const std::string what = fmt::format("rank {} (pid {}) {}", rank, pid, describe_status(status));
  if (reason_ == StopReason::kNone) {
    first_was_error_ = WIFEXITED(status);
    return first_failure(rank, what, exit_code_of(status));
  }
  // After a rank failure the others' statuses help tell its consequences from other faults; after a
  // signal, the timeout or a failed start the ranks die because zerorun stops them.
  if (reason_ == StopReason::kRankFailed) {
    if (!teardown_ && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) lose(rank);
    return {.message = what};
  }
  return {};
}

StopResponse JobOutcome::rank_silent(int rank, pid_t pid, double silent_s) {
  const std::string what =
      fmt::format("rank {} (pid {}) sent no heartbeat for {:.1f} s (--heartbeat-s): stopped or frozen; killed it", rank,
                  pid, silent_s);
  if (reason_ == StopReason::kNone) return first_failure(rank, what, 128 + SIGKILL);
  if (reason_ == StopReason::kRankFailed && !teardown_) lose(rank);
  return {.message = what};
}

StopResponse JobOutcome::peer_failed(const std::string& what) {
  if (ending()) return {};
  reason_ = StopReason::kPeerFailed;
  exit_code_ = 1;
  failure_ = what;
  return {.action = StopResponse::Action::kTearDownAfterReport,
          .message = fmt::format("the job failed elsewhere first ({}); stopping this node's ranks", what)};
}

StopResponse JobOutcome::re_form(const std::string& what) {
  StopResponse r = peer_failed(what);
  if (r.action != StopResponse::Action::kNone) r.message = fmt::format("{}; stopping this node's ranks", what);
  return r;
}

void JobOutcome::after_another_node() {
  if (first_was_error_ && !lost_.empty()) lost_.erase(lost_.begin());
  first_was_error_ = false;
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
