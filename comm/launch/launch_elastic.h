#pragma once
// The launchers' meeting place for an elastic job on several nodes (zerorun --nnodes MIN:MAX
// --max-restarts N): keys under "zerorun/" in the store node 0's zerorun hosts for the whole job.
//
//   attempt a:  every launcher joins with the ranks it has left ("zerorun/a/node/K" = count); node
//               0 waits until every node of the last attempt that was not lost joined, or
//               --join-timeout-s, and publishes the plan ("zerorun/a/plan": every node that joined,
//               with its ranks, in node order; "zerorun/current" = a), which numbers the ranks; a
//               node not in it leaves the job
//   a newcomer: a launcher that starts while attempt a runs (a replacement node) joins a + 1 and
//               waits; node 0 sees it join and stops attempt a (a restart, claimed as "node K
//               joined"), so that a + 1 runs with it; "zerorun/over" when the job ends lets a
//               newcomer that came too late leave
//   a failure:  the launcher that sees a rank fail claims the attempt's failure (compare-and-set:
//               the first claim wins); the others see the claim in their supervisor's loop and stop
//               their ranks, which are survivors
//   alive:      every launcher beats ("zerorun/a/alive/K") from its supervisor's loop; a node of the
//               plan whose beats stop is lost whole (its zerorun gone, its ranks with it), which its
//               peers' ranks would otherwise report as failures of their own; the node that
//               finds it silent marks it ("zerorun/a/lost/K"), so that node 0 does not wait the
//               join timeout for it at the next attempt
//   the end:    each node whose ranks all exited 0 says so; node 0 keeps the store up until every
//               node of the plan has said so or the attempt failed
//
// Losing node 0's zerorun loses the store: the others end, naming it.
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/store/store.h"

namespace zero::comm {

class JobBoard {
 public:
  struct Plan {
    std::vector<std::pair<int, int>> nodes;  // (node rank, ranks on it), in node order
    int world = 0;
    int first_rank = 0;  // this node's first global rank
    int node_index = 0;  // this node's place in `nodes`
    int attempt = 0;
    std::string text() const;  // "node 0: 2 ranks, node 1: 1 rank"
  };

  JobBoard(std::shared_ptr<Store> store, int node_rank, std::chrono::milliseconds join_timeout);

  // Joins attempt `attempt` with `nproc` ranks. Node 0 decides the plan once every node in `awaited`
  // joined or the join timeout passed, taking every node that joined (a newcomer too):
  // InvalidArgument naming the counts when fewer than `min_nodes` nodes with ranks joined (the
  // others learn it from the plan). nullopt: this node is not in the plan.
  std::optional<Plan> join(int attempt, int nproc, const std::vector<int>& awaited, int min_nodes, int max_nodes);
  // A node that comes while the job runs (a replacement): joins the attempt after the current one
  // and waits, for as long as the job lasts, for node 0 to form it (node 0 stops the running attempt
  // when it sees a newcomer). nullopt: the job ended first.
  std::optional<Plan> join_running(int nproc);
  // The attempt whose plan node 0 published last; -1 before the first.
  int current_attempt();
  // Node 0: whether a node joined the attempt after `attempt` while `attempt` runs (a newcomer).
  bool newcomer(int attempt);
  // Node 0, as it leaves: the job is over (a newcomer still waiting leaves too).
  void end_job();
  // This node's rank failure, claimed as the attempt's: true when it is the first claim.
  bool claim_failure(int attempt, const std::string& what);
  // The claimed failure of the attempt, if any.
  std::optional<std::string> failure(int attempt);
  // This node's ranks all exited 0.
  void done(int attempt);
  // Beats for this node and notes the others' beats (call it often: every 200 ms).
  void beat(int attempt, const Plan& plan);
  // The nodes of the plan whose beats have not moved for `quiet` (as seen by beat()), in plan order.
  std::vector<int> silent_nodes(const Plan& plan, std::chrono::milliseconds quiet) const;
  // A node found silent in `attempt` is lost: node 0 does not wait for it to join the next one.
  void mark_lost(int attempt, int node);
  // The plan's nodes that `attempt` did not lose: the ones node 0 waits for at the next attempt.
  std::vector<int> kept_nodes(int attempt, const Plan& plan);
  // Node 0: until every node of the plan is done or the attempt failed, at most `timeout`.
  void wait_for_nodes(int attempt, const Plan& plan, std::chrono::milliseconds timeout);

 private:
  std::string key(int attempt, const std::string& what) const;
  void enter(int attempt, int nproc);  // this node's ranks for `attempt`, counted among the joined
  Plan read_plan(int attempt, const std::string& text) const;
  std::shared_ptr<Store> store_;
  int node_rank_;
  std::chrono::milliseconds join_timeout_;
  // Each other node's last beat count and when it last moved.
  std::map<int, std::pair<int64_t, std::chrono::steady_clock::time_point>> seen_;
  int seen_attempt_ = -1;  // the attempt seen_ is of
};

}  // namespace zero::comm
