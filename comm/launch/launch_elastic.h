#pragma once
// The launchers' meeting place for an elastic job on several nodes (zerorun --nnodes MIN:MAX
// --max-restarts N): keys under "zerorun/" in the store node 0's zerorun hosts for the whole job.
//
//   attempt a:  every launcher joins with the ranks it has left ("zerorun/a/node/K" = count); node
//               0 waits until every node of the last attempt joined, or --join-timeout-s, and
//               publishes the plan ("zerorun/a/plan": the nodes with ranks, in node order), which
//               numbers the ranks; a node not in it leaves the job
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
    std::string text() const;  // "node 0: 2 ranks, node 1: 1 rank"
  };

  JobBoard(std::shared_ptr<Store> store, int node_rank, std::chrono::milliseconds join_timeout);

  // Joins attempt `attempt` with `nproc` ranks. Node 0 decides the plan once `expected` nodes joined
  // or the join timeout passed: InvalidArgument naming the counts when fewer than `min_nodes` nodes
  // with ranks joined (the others learn it from the plan). nullopt: this node is not in the plan.
  std::optional<Plan> join(int attempt, int nproc, int expected, int min_nodes, int max_nodes);
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
  int lost_nodes(int attempt, const Plan& plan);
  // Node 0: until every node of the plan is done or the attempt failed, at most `timeout`.
  void wait_for_nodes(int attempt, const Plan& plan, std::chrono::milliseconds timeout);

 private:
  std::string key(int attempt, const std::string& what) const;
  std::shared_ptr<Store> store_;
  int node_rank_;
  std::chrono::milliseconds join_timeout_;
  // Each other node's last beat count and when it last moved.
  std::map<int, std::pair<int64_t, std::chrono::steady_clock::time_point>> seen_;
};

}  // namespace zero::comm
