#include "comm/launch/launch_supervisor.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <utility>

#include "comm/store/tcp_store_socket.h"

namespace zero::comm {

namespace {

using Clock = std::chrono::steady_clock;

// The failure claimed for a node whose zerorun stopped beating.
std::string node_lost(int node) { return fmt::format("node {}'s zerorun stopped answering (lost with its ranks)", node); }

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// One thread and one poll loop for everything (output, signals, child exits, deadlines): the signal
// handlers and SIGCHLD only wake the loop, so the job's state changes in one place, in a fixed order
// per iteration (output, signals, exits, deadlines), and the teardown deadlines need no timers.
class Supervisor {
 public:
  Supervisor(std::vector<RankProcess>& ranks, LaunchSignals& signals, const LaunchOptions& options, FailureBoard* board)
      : board_(board),
        ranks_(ranks),
        signals_(signals),
        options_(options),
        outcome_(options.report_s, options.timeout_s),
        start_(Clock::now()),
        grace_(seconds(options.grace_s)) {}

  SupervisedJob run(bool all_started) {
    if (!all_started) apply(outcome_.start_failed());
    while (any_running()) {
      wait_and_pump_output();
      forward_signals();
      reap_exited_ranks();
      check_heartbeats();
      watch_board(false);
      end_report_window();
      enforce_job_deadline();
      enforce_grace_period();
    }
    watch_board(true);  // a claim still waiting is made now
    return {.outcome = outcome_, .failed_at = failed_at_};
  }

 private:
  bool any_running() const {
    for (const auto& r : ranks_) {
      if (r.running) return true;
    }
    return false;
  }

  // Waits for output, a signal or a child exit (SIGCHLD pokes the self-pipe) and re-emits the
  // output. The wait is bounded by the next teardown deadline and by 200 ms, so that the job
  // deadline (checked after every wait) is noticed without a wake-up time of its own.
  void wait_and_pump_output() {
    std::vector<pollfd> fds;
    std::vector<RankOutputStream*> streams;
    fds.push_back({signals_.wake_fd(), POLLIN, 0});
    for (auto& r : ranks_) {
      for (RankOutputStream* s : {&r.out, &r.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
    }
    std::vector<RankProcess*> beaters;
    for (auto& r : ranks_) {
      if (r.heartbeat_fd >= 0) {
        fds.push_back({r.heartbeat_fd, POLLIN, 0});
        beaters.push_back(&r);
      }
    }
    auto wake_at = Clock::now() + std::chrono::milliseconds(200);
    if (!killed_ && kill_at_ < wake_at) wake_at = kill_at_;
    if (term_at_ < wake_at) wake_at = term_at_;
    const int rc = ::poll(fds.data(), fds.size(), net::poll_timeout_ms(wake_at));
    if (rc <= 0) return;
    if (fds[0].revents != 0) signals_.drain_wake();
    for (size_t k = 0; k < streams.size(); ++k) {
      if (fds[1 + k].revents != 0) streams[k]->read_available();
    }
    for (size_t k = 0; k < beaters.size(); ++k) {
      if (fds[1 + streams.size() + k].revents != 0) take_beats(*beaters[k]);
    }
  }

  // Reads the beats that arrived; end of stream (the rank is exiting) ends the watch.
  static void take_beats(RankProcess& r) {
    char buf[256];
    const ssize_t n = ::read(r.heartbeat_fd, buf, sizeof(buf));
    if (n > 0) {
      r.last_beat = Clock::now();
      r.beating = true;
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      ::close(r.heartbeat_fd);
      r.heartbeat_fd = -1;
      r.beating = false;
    }
  }

  // --heartbeat-s: a running rank that beat once and has been silent since for that long is stopped
  // or frozen. It gets SIGKILL now (a stopped process takes no SIGTERM) and fails the job.
  void check_heartbeats() {
    if (options_.heartbeat_s <= 0) return;
    const auto now = Clock::now();
    for (auto& r : ranks_) {
      if (!r.running || !r.beating || now - r.last_beat < seconds(options_.heartbeat_s)) continue;
      r.beating = false;
      signal_rank(r, SIGKILL);
      apply(outcome_.rank_silent(r.rank, r.pid, std::chrono::duration<double>(now - r.last_beat).count()));
    }
  }

  // SIGINT/SIGTERM/SIGHUP are forwarded; a second one escalates to SIGKILL at once.
  void forward_signals() {
    if (const int sig = signals_.take_new_signal(); sig != 0) apply(outcome_.signal_received(sig));
  }

  // The ranks killed by a signal are taken first among those that exited since the last look: a
  // rank that a peer's death makes fail exits with an error moments after it, and when both land
  // in one look, the killed rank is the cause (and the one a restart leaves out).
  void reap_exited_ranks() {
    std::vector<std::pair<RankProcess*, int>> exits;
    for (auto& r : ranks_) {
      if (!r.running) continue;
      if (const auto status = reap_if_exited(r)) exits.emplace_back(&r, *status);
    }
    std::stable_partition(exits.begin(), exits.end(), [](const auto& e) { return WIFSIGNALED(e.second); });
    for (const auto& [r, status] : exits) apply(outcome_.rank_exited(r->rank, r->pid, status));
  }

  // Several nodes: claims this node's first failure (an error exit only after 1.5 s, in which a node
  // whose rank was killed may claim first, or a node's stopped beats show it lost whole), or stops
  // this node's ranks when another node's claim comes first or a node falls silent. The store is
  // asked at most every 200 ms; its loss ends this node's job.
  void watch_board(bool finishing) {
    if (board_ == nullptr) return;
    const auto now = Clock::now();
    try {
      if (now >= next_poll_ || finishing) {
        next_poll_ = now + std::chrono::milliseconds(200);
        board_->beat();
        if (!claim_pending_ && !outcome_.ending()) {
          if (const std::optional<std::string> other = board_->elsewhere()) {
            apply(outcome_.peer_failed(*other));
          } else if (const std::optional<int> node = board_->silent_node()) {
            const std::string what = node_lost(*node);
            board_->claim(what);  // the first claim wins; the job's failure is the one claimed
            apply(outcome_.peer_failed(board_->elsewhere().value_or(what)));
          } else if (board_->newcomer && board_->newcomer()) {
            // A node came to join (a replacement): the job stops and starts again with it.
            const std::string what = "a node joined the job, which starts again with it";
            if (board_->claim(what)) {
              apply(outcome_.re_form(what));
            } else {
              apply(outcome_.peer_failed(board_->elsewhere().value_or(what)));
            }
          }
          return;
        }
      }
      if (!claim_pending_) return;
      if (now < claim_at_ && !finishing) {
        if (board_->elsewhere()) {
          claim_pending_ = false;
          outcome_.after_another_node();
        }
        return;
      }
      claim_pending_ = false;
      if (outcome_.first_was_error()) {
        if (const std::optional<int> node = board_->silent_node()) {
          // This node's rank failed because a whole node went: that node is the cause.
          board_->claim(node_lost(*node));
          outcome_.after_another_node();
          return;
        }
      }
      if (!board_->claim(outcome_.failure())) outcome_.after_another_node();
    } catch (const std::exception& e) {
      board_ = nullptr;
      claim_pending_ = false;
      if (!finishing) apply(outcome_.peer_failed(fmt::format("the store on node 0 is gone: {}", e.what())));
    }
  }

  // After a rank failed, the others had --report-s to exit on their own; then they get SIGTERM.
  void end_report_window() {
    if (term_at_ != Clock::time_point::max() && Clock::now() >= term_at_) {
      term_at_ = Clock::time_point::max();
      tear_down(SIGTERM);
    }
  }

  void enforce_job_deadline() {
    if (options_.timeout_s > 0 && Clock::now() - start_ >= std::chrono::duration<double>(options_.timeout_s)) {
      apply(outcome_.deadline_passed());
    }
  }

  void enforce_grace_period() {
    if (killed_ || !any_running() || Clock::now() < kill_at_) return;
    outcome_.teardown_started();
    say(fmt::format("ranks still running {} s after SIGTERM; sending SIGKILL", options_.grace_s));
    for (const auto& r : ranks_) {
      if (r.running) signal_rank(r, SIGKILL);
    }
    killed_ = true;
  }

  void apply(const StopResponse& response) {
    if (!response.message.empty()) say(response.message);
    if (failed_at_ == 0 && (outcome_.reason() == StopReason::kRankFailed || outcome_.reason() == StopReason::kPeerFailed)) {
      failed_at_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      if (board_ != nullptr && outcome_.reason() == StopReason::kRankFailed) {
        claim_pending_ = true;
        claim_at_ = Clock::now() + std::chrono::milliseconds(outcome_.first_was_error() ? 1500 : 0);
      }
    }
    switch (response.action) {
      case StopResponse::Action::kNone:
        break;
      case StopResponse::Action::kTearDown:
        tear_down(response.signal);
        break;
      case StopResponse::Action::kTearDownAfterReport:
        term_at_ = Clock::now() + seconds(options_.report_s);
        break;
      case StopResponse::Action::kKillNow:
        kill_at_ = Clock::now();
        break;
    }
  }

  // Signals every running rank; the first teardown starts the grace period before SIGKILL.
  void tear_down(int sig) {
    outcome_.teardown_started();
    for (const auto& r : ranks_) {
      if (r.running) signal_rank(r, sig);
    }
    if (kill_at_ == Clock::time_point::max()) kill_at_ = Clock::now() + grace_;
  }

  FailureBoard* board_;
  bool claim_pending_ = false;
  Clock::time_point claim_at_{}, next_poll_{};
  std::vector<RankProcess>& ranks_;
  LaunchSignals& signals_;
  const LaunchOptions& options_;
  JobOutcome outcome_;
  const Clock::time_point start_;
  const Clock::duration grace_;
  Clock::time_point kill_at_ = Clock::time_point::max();  // SIGKILL whatever still runs then
  Clock::time_point term_at_ = Clock::time_point::max();  // a rank failed: SIGTERM the rest then
  bool killed_ = false;
  double failed_at_ = 0;
};

}  // namespace

SupervisedJob supervise_ranks(std::vector<RankProcess>& ranks, LaunchSignals& signals, const LaunchOptions& options,
                              bool all_started, FailureBoard* board) {
  return Supervisor(ranks, signals, options, board).run(all_started);
}

}  // namespace zero::comm
