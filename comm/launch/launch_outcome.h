#pragma once
// zerorun's verdict on a job: its exit status and the lines it says about why the job ends,
// decided from the job's events in the order they happen. The first cause of the end wins and
// fixes the exit status; what follows it (ranks dying of the teardown) cannot change it. Kept apart
// from processes and clocks so that a list of rank statuses can be checked without starting any
// (launch_outcome_test).
#include <sys/types.h>

#include <string>
#include <vector>

namespace zero::comm {

// Why the job is ending; kNone while it runs normally.
enum class StopReason { kNone, kStartFailed, kRankFailed, kPeerFailed, kSignal, kTimeout };

// What the supervisor does about an event: say `message` ("zerorun: " is added) when not empty,
// then take `action`.
struct StopResponse {
  enum class Action {
    kNone,
    kTearDown,             // send `signal` to every running rank now; SIGKILL after --grace-s
    kTearDownAfterReport,  // SIGTERM every running rank after --report-s (they may report first)
    kKillNow,              // SIGKILL every running rank now
  };
  Action action = Action::kNone;
  int signal = 0;  // for kTearDown
  std::string message;
};

class JobOutcome {
 public:
  // report_s and timeout_s as given to zerorun (they appear in the messages).
  JobOutcome(double report_s, double timeout_s) : report_s_(report_s), timeout_s_(timeout_s) {}

  // Not every rank could be started (the spawn said why): exit 1, and stop the ones that did start.
  StopResponse start_failed();
  // zerorun got SIGINT, SIGTERM or SIGHUP. The first forwards it to the ranks and makes the exit
  // status 128 + sig; one after the job is already ending for any reason kills the ranks at once.
  StopResponse signal_received(int sig);
  // A rank exited with waitpid status `status`. The first failure (not exit 0) ends the job with its
  // status (128 + signal when killed by one); later ones during that teardown are only reported.
  StopResponse rank_exited(int rank, pid_t pid, int status);
  // The job ran past --timeout-s: exit 124, unless the job was already ending for another reason.
  StopResponse deadline_passed();
  // A rank's heartbeat has been silent for silent_s (--heartbeat-s) and the supervisor has killed
  // it (a stopped process takes no SIGTERM): a failure like rank_exited's, exit status 128 + SIGKILL.
  StopResponse rank_silent(int rank, pid_t pid, double silent_s);
  // Several nodes: another node's zerorun claimed the job's first failure (`what`). This node's ranks
  // are stopped as survivors (exit 1); ignored once this node's job is ending for another reason.
  StopResponse peer_failed(const std::string& what);
  // The job stops to start again with a node that joined (`what` says which): as peer_failed, with
  // nothing lost.
  StopResponse re_form(const std::string& what);
  // Several nodes: this node's first failure came after another node's (whose claim was first). Its
  // rank is a survivor unless it was killed by SIGKILL or went silent: those are lost either way.
  void after_another_node();
  bool first_was_error() const { return first_was_error_; }
  // The supervisor begins signalling the ranks: a rank killed from here on is zerorun's doing.
  void teardown_started() { teardown_ = true; }

  // The ranks taken as lost for a restart (--max-restarts): the one whose failure ended the job
  // (killed, exited with an error, or silent), and any other that was killed by SIGKILL or went
  // silent before the teardown. A rank that exits with an error after a peer's failure is a
  // survivor: that is how a rank reports a peer it lost (its collective fails), never by a SIGKILL.
  const std::vector<int>& lost_ranks() const { return lost_; }
  // The failure that ended the job ("rank 3 (pid 123) was killed by signal 9 (SIGKILL)"); empty
  // unless a rank failed.
  const std::string& failure() const { return failure_; }

  StopReason reason() const { return reason_; }
  bool ending() const { return reason_ != StopReason::kNone; }
  // zerorun's exit status once every rank has exited: 0 unless something above ended the job.
  int exit_code() const { return exit_code_; }

 private:
  void lose(int rank);
  // The first rank failure: the job's reason, exit status and cause.
  StopResponse first_failure(int rank, const std::string& what, int exit_code);

  double report_s_, timeout_s_;
  StopReason reason_ = StopReason::kNone;
  int exit_code_ = 0;
  bool teardown_ = false;
  bool first_was_error_ = false;  // the first failure: an exit with an error (not a kill or silence)
  std::vector<int> lost_;
  std::string failure_;
};

}  // namespace zero::comm
