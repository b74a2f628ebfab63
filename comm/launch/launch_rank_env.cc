#include "comm/launch/launch_rank_env.h"

#include <fmt/format.h>

#include <set>
#include <utility>

namespace zero::comm {

int global_rank(const LaunchOptions& o, const RankAttempt& attempt, int local_rank) {
  return (attempt.first_rank >= 0 ? attempt.first_rank : o.node_rank * o.nproc_per_node) + local_rank;
}

std::vector<std::string> rank_environment(const LaunchOptions& o, const RankRendezvous& rendezvous,
                                          const RankAttempt& attempt, const std::vector<std::string>& parent,
                                          int local_rank, int heartbeat_fd) {
  static const std::set<std::string> kOwned = {
      "MASTER_ADDR",          "MASTER_PORT",         "RANK",           "WORLD_SIZE",
      "LOCAL_RANK",           "LOCAL_WORLD_SIZE",    "GROUP_RANK",     "ZERO_JOB_TOKEN",
      "ZERO_STORE_IN_LAUNCHER", "ZERO_RESTART_COUNT", "ZERO_RESTART_FAILED_AT", "ZERO_RESTART_REASON",
      "ZERO_HEARTBEAT_FD",    "ZERO_HEARTBEAT_INTERVAL_MS", "ZERO_FIRST_WORLD_SIZE", "ZERO_STORE_PREFIX",
      "ZERO_NODE_RANK"};
  const int rank = global_rank(o, attempt, local_rank);
  std::vector<std::pair<std::string, std::string>> vars = {
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(rendezvous.port)},
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(attempt.world > 0 ? attempt.world : o.nnodes * o.nproc_per_node)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(attempt.group_rank >= 0 ? attempt.group_rank : o.node_rank)},
      {"ZERO_NODE_RANK", std::to_string(o.node_rank)},  // the same in every attempt, unlike GROUP_RANK
      {"ZERO_JOB_TOKEN", rendezvous.token},
      {"ZERO_STORE_IN_LAUNCHER", "1"},
      {"ZERO_RESTART_COUNT", std::to_string(attempt.restart_count)},
      {"ZERO_FIRST_WORLD_SIZE",
       std::to_string(attempt.first_world > 0 ? attempt.first_world : o.nnodes * o.nproc_per_node)},
  };
  if (!attempt.store_prefix.empty()) vars.emplace_back("ZERO_STORE_PREFIX", attempt.store_prefix);
  if (attempt.restart_count > 0) {
    vars.emplace_back("ZERO_RESTART_FAILED_AT", fmt::format("{:.3f}", attempt.failed_at));
    vars.emplace_back("ZERO_RESTART_REASON", attempt.reason);
  }
  if (heartbeat_fd >= 0) {
    vars.emplace_back("ZERO_HEARTBEAT_FD", std::to_string(heartbeat_fd));
    vars.emplace_back("ZERO_HEARTBEAT_INTERVAL_MS", std::to_string(attempt.heartbeat_interval_ms));
  }
  std::vector<std::string> out;
  for (const std::string& entry : parent) {
    const std::string name = entry.substr(0, entry.find('='));
    if (kOwned.count(name) == 0) out.push_back(entry);
  }
  for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
  return out;
}

}  // namespace zero::comm
