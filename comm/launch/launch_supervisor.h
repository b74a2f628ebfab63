#pragma once
// Supervising a started job until every rank has exited: re-emitting the ranks' output, forwarding
// zerorun's signals, noticing the first failure (an exit, or a heartbeat gone silent) and the
// deadline, and tearing the job down (SIGTERM, SIGKILL after --grace-s) when it must end.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/launch/launch_args.h"
#include "comm/launch/launch_outcome.h"
#include "comm/launch/launch_rank_process.h"
#include "comm/launch/launch_signals.h"

namespace zero::comm {

// Several nodes with restarts (comm/launch/launch_elastic.h): where the supervisor claims this node's
// first rank failure as the job's, and sees another node's claim. Calls may throw CommError when the
// store on node 0 is gone.
struct FailureBoard {
  std::function<bool(const std::string&)> claim;          // true: this node's failure is the first
  std::function<std::optional<std::string>()> elsewhere;  // another node's claimed failure, if any
  std::function<void()> beat;                             // this node's beat, the others' noted
  std::function<std::optional<int>()> silent_node;        // a node whose beats stopped, if any
  std::function<bool()> newcomer;                         // node 0: a node joined the next attempt
};

struct SupervisedJob {
  JobOutcome outcome;
  double failed_at = 0;  // when the rank failure that ended it was seen (seconds since the epoch); 0: none
};

// Returns once no rank is running, with the job's outcome. all_started false (a rank could not be
// started) ends the job at once: the ranks in `ranks` are stopped and zerorun exits 1. The ranks'
// pipes may still be open afterwards (a rank's leftover child can hold them). With --heartbeat-s a
// rank whose heartbeat stops for that long is killed and counts as failed.
// With a board, this node's first failure is claimed (a kill at once; an error exit after 1.5 s, in
// which a killed rank elsewhere may claim first, or a node's silence shows that it was lost whole,
// which is then claimed instead), another node's claim stops this node's ranks as survivors, and a
// node whose beats stop is claimed lost.
SupervisedJob supervise_ranks(std::vector<RankProcess>& ranks, LaunchSignals& signals, const LaunchOptions& options,
                              bool all_started, FailureBoard* board = nullptr);

}  // namespace zero::comm
