// zerorun's exit status and messages from lists of rank statuses, signals and the deadline, without
// starting a process: the first cause of the end fixes the status, later events cannot change it.
#include "comm/launch/launch_outcome.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <vector>

namespace zero::comm {
namespace {

using Action = StopResponse::Action;

// waitpid statuses as the kernel reports them.
int exited(int code) { return W_EXITCODE(code, 0); }
int killed_by(int sig) { return W_EXITCODE(0, sig); }

struct RankStatus {
  int rank;
  int status;
};

// Feeds the ranks' exits in order (pid = 100 + rank) and collects what zerorun would say.
std::vector<std::string> feed_exits(JobOutcome& outcome, const std::vector<RankStatus>& exits) {
  std::vector<std::string> said;
  for (const auto& e : exits) {
    const StopResponse r = outcome.rank_exited(e.rank, 100 + e.rank, e.status);
    if (!r.message.empty()) said.push_back(r.message);
  }
  return said;
}

TEST_CASE("every rank exiting 0: exit 0, nothing said, nothing stopped") {
  JobOutcome outcome(5, 0);
  for (int rank = 0; rank < 3; ++rank) {
    const StopResponse r = outcome.rank_exited(rank, 100 + rank, exited(0));
    CHECK(r.action == Action::kNone);
    CHECK(r.message.empty());
  }
  CHECK(outcome.exit_code() == 0);
  CHECK(outcome.reason() == StopReason::kNone);
  CHECK(!outcome.ending());
}

TEST_CASE("the first failure fixes the status; the teardown's victims are named but do not change it") {
  JobOutcome outcome(5, 0);
  CHECK(outcome.rank_exited(0, 100, exited(0)).action == Action::kNone);
  const StopResponse first = outcome.rank_exited(1, 101, exited(3));
  CHECK(first.action == Action::kTearDownAfterReport);
  CHECK(first.message ==
        "rank 1 (pid 101) exited with status 3; stopping the other ranks (after up to 5 s for them to report)");
  const std::vector<std::string> later =
      feed_exits(outcome, {{2, killed_by(SIGTERM)}, {3, exited(7)}, {4, exited(0)}});
  CHECK(later == std::vector<std::string>{"rank 2 (pid 102) was killed by signal 15 (SIGTERM)",
                                          "rank 3 (pid 103) exited with status 7"});
  CHECK(outcome.exit_code() == 3);
  CHECK(outcome.reason() == StopReason::kRankFailed);
}

TEST_CASE("a rank killed by a signal first: 128 + signal") {
  JobOutcome outcome(0.5, 0);
  const std::vector<std::string> said = feed_exits(outcome, {{2, killed_by(SIGKILL)}, {0, exited(1)}});
  CHECK(said == std::vector<std::string>{
                    "rank 2 (pid 102) was killed by signal 9 (SIGKILL); stopping the other ranks (after up "
                    "to 0.5 s for them to report)",
                    "rank 0 (pid 100) exited with status 1"});
  CHECK(outcome.exit_code() == 128 + SIGKILL);
}

TEST_CASE("--report-s 0: the others are stopped without the report window in the message") {
  JobOutcome outcome(0, 0);
  const StopResponse r = outcome.rank_exited(0, 100, exited(2));
  CHECK(r.action == Action::kTearDownAfterReport);
  CHECK(r.message == "rank 0 (pid 100) exited with status 2; stopping the other ranks");
  CHECK(outcome.exit_code() == 2);
}

TEST_CASE("a signal to zerorun is forwarded once; the next kills; rank failures after it are silent") {
  JobOutcome outcome(5, 0);
  const StopResponse first = outcome.signal_received(SIGINT);
  CHECK(first.action == Action::kTearDown);
  CHECK(first.signal == SIGINT);
  CHECK(first.message == "got signal 2 (SIGINT); forwarding it to the ranks");
  CHECK(feed_exits(outcome, {{0, killed_by(SIGINT)}, {1, exited(5)}}).empty());
  const StopResponse second = outcome.signal_received(SIGTERM);
  CHECK(second.action == Action::kKillNow);
  CHECK(second.message == "got another signal; killing the ranks");
  CHECK(outcome.deadline_passed().action == Action::kNone);
  CHECK(outcome.exit_code() == 128 + SIGINT);
  CHECK(outcome.reason() == StopReason::kSignal);
}

TEST_CASE("the deadline: exit 124 with SIGTERM, whatever the ranks then exit with") {
  JobOutcome outcome(5, 1.5);
  const StopResponse r = outcome.deadline_passed();
  CHECK(r.action == Action::kTearDown);
  CHECK(r.signal == SIGTERM);
  CHECK(r.message == "the job ran past --timeout-s=1.5; stopping the ranks");
  CHECK(feed_exits(outcome, {{0, killed_by(SIGTERM)}, {1, exited(9)}}).empty());
  // Checked again on every loop iteration after the deadline: nothing more happens.
  const StopResponse again = outcome.deadline_passed();
  CHECK(again.action == Action::kNone);
  CHECK(again.message.empty());
  CHECK(outcome.signal_received(SIGTERM).action == Action::kKillNow);
  CHECK(outcome.exit_code() == 124);
  CHECK(outcome.reason() == StopReason::kTimeout);
}

TEST_CASE("a deadline after a rank failure does not turn its status into 124") {
  JobOutcome outcome(5, 1);
  feed_exits(outcome, {{1, exited(4)}});
  CHECK(outcome.deadline_passed().action == Action::kNone);
  CHECK(outcome.exit_code() == 4);
}

TEST_CASE("a failed start: exit 1 and SIGTERM to the ranks that started; their exits are silent") {
  JobOutcome outcome(5, 0);
  const StopResponse r = outcome.start_failed();
  CHECK(r.action == Action::kTearDown);
  CHECK(r.signal == SIGTERM);
  CHECK(r.message.empty());  // the spawn already said why
  CHECK(feed_exits(outcome, {{0, killed_by(SIGTERM)}}).empty());
  CHECK(outcome.signal_received(SIGINT).action == Action::kKillNow);
  CHECK(outcome.exit_code() == 1);
  CHECK(outcome.reason() == StopReason::kStartFailed);
}

TEST_CASE("the lost ranks: the first failure, and any other SIGKILL before the teardown; errors after it survive") {
  JobOutcome outcome(5, 0);
  feed_exits(outcome, {{3, killed_by(SIGKILL)}, {0, exited(1)}, {1, killed_by(SIGKILL)}});
  CHECK(outcome.lost_ranks() == std::vector<int>{3, 1});
  CHECK(outcome.failure() == "rank 3 (pid 103) was killed by signal 9 (SIGKILL)");
  outcome.teardown_started();
  feed_exits(outcome, {{2, killed_by(SIGKILL)}});  // zerorun's own SIGKILL past --grace-s
  CHECK(outcome.lost_ranks() == std::vector<int>{3, 1});

  // A program error is lost too when it comes first: its rank is the one the restart leaves out.
  JobOutcome error(5, 0);
  feed_exits(error, {{2, exited(1)}, {0, exited(1)}});
  CHECK(error.lost_ranks() == std::vector<int>{2});
}

TEST_CASE("a silent rank: killed, named with its silence, lost; 128 + SIGKILL") {
  JobOutcome outcome(5, 0);
  const StopResponse r = outcome.rank_silent(1, 101, 3.04);
  CHECK(r.action == Action::kTearDownAfterReport);
  CHECK(r.message ==
        "rank 1 (pid 101) sent no heartbeat for 3.0 s (--heartbeat-s): stopped or frozen; killed it; stopping the other "
        "ranks (after up to 5 s for them to report)");
  CHECK(outcome.exit_code() == 128 + SIGKILL);
  CHECK(outcome.reason() == StopReason::kRankFailed);
  // Its SIGKILL, reaped later, is only reported.
  const std::vector<std::string> said = feed_exits(outcome, {{1, killed_by(SIGKILL)}, {0, exited(1)}});
  CHECK(said.size() == 2);
  CHECK(outcome.lost_ranks() == std::vector<int>{1});
  CHECK(outcome.exit_code() == 128 + SIGKILL);
}

TEST_CASE("several nodes: another node's failure first stops this node's ranks as survivors") {
  JobOutcome peer(5, 0);
  const StopResponse r = peer.peer_failed("rank 5 (pid 9) was killed by signal 9 (SIGKILL)");
  CHECK(r.action == Action::kTearDownAfterReport);
  CHECK(r.message == "the job failed elsewhere first (rank 5 (pid 9) was killed by signal 9 (SIGKILL)); stopping this "
                     "node's ranks");
  CHECK(peer.reason() == StopReason::kPeerFailed);
  CHECK(peer.exit_code() == 1);
  feed_exits(peer, {{0, exited(1)}, {1, killed_by(SIGTERM)}});
  CHECK(peer.lost_ranks().empty());

  // An error exit here that lost the race to another node's claim: a survivor. A kill: lost anyway.
  JobOutcome error(5, 0);
  feed_exits(error, {{1, exited(1)}});
  error.after_another_node();
  CHECK(error.lost_ranks().empty());
  JobOutcome killed(5, 0);
  feed_exits(killed, {{1, killed_by(SIGKILL)}});
  killed.after_another_node();
  CHECK(killed.lost_ranks() == std::vector<int>{1});
}

}  // namespace
}  // namespace zero::comm
