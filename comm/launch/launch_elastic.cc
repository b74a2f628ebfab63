#include "comm/launch/launch_elastic.h"

#include <fmt/format.h>

#include <thread>

#include "base/check.h"

namespace zero::comm {

namespace {

using Clock = std::chrono::steady_clock;

std::string as_text(const Bytes& b) { return std::string(b.begin(), b.end()); }

// "0:2,1:1" <-> the plan's nodes; "none: ..." is a plan node 0 could not make.
std::string encode(const std::vector<std::pair<int, int>>& nodes) {
  std::string out;
  for (const auto& [node, n] : nodes) out += fmt::format("{}{}:{}", out.empty() ? "" : ",", node, n);
  return out;
}

std::vector<std::pair<int, int>> decode(const std::string& text) {
  std::vector<std::pair<int, int>> nodes;
  size_t at = 0;
  while (at < text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t colon = item.find(':');
    nodes.emplace_back(std::stoi(item.substr(0, colon)), std::stoi(item.substr(colon + 1)));
    at = comma + 1;
  }
  return nodes;
}

}  // namespace

std::string JobBoard::Plan::text() const {
  std::string out;
  for (const auto& [node, n] : nodes) {
    out += fmt::format("{}node {}: {} rank{}", out.empty() ? "" : ", ", node, n, n == 1 ? "" : "s");
  }
  return out;
}

JobBoard::JobBoard(std::shared_ptr<Store> store, int node_rank, std::chrono::milliseconds join_timeout)
    : store_(std::move(store)), node_rank_(node_rank), join_timeout_(join_timeout) {}

std::string JobBoard::key(int attempt, const std::string& what) const {
  return fmt::format("zerorun/{}/{}", attempt, what);
}

void JobBoard::enter(int attempt, int nproc) {
  store_->set_string(key(attempt, fmt::format("node/{}", node_rank_)), std::to_string(nproc));
  store_->add(key(attempt, "joined"), 1);
}

std::optional<JobBoard::Plan> JobBoard::join(int attempt, int nproc, const std::vector<int>& awaited, int min_nodes,
                                              int max_nodes) {
  enter(attempt, nproc);
  if (node_rank_ == 0) {
    const auto deadline = Clock::now() + join_timeout_;
    for (int node : awaited) {
      while (!store_->check({key(attempt, fmt::format("node/{}", node))}) && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    std::vector<std::pair<int, int>> nodes;
    for (int k = 0; k < max_nodes; ++k) {
      const std::string node_key = key(attempt, fmt::format("node/{}", k));
      if (!store_->check({node_key})) continue;
      const int n = std::stoi(store_->get_string(node_key, join_timeout_));
      if (n > 0) nodes.emplace_back(k, n);
    }
    if (static_cast<int>(nodes.size()) < min_nodes) {
      const std::string why = fmt::format("{} node(s) with ranks joined attempt {} within {} ms, fewer than {} (--nnodes MIN)",
                                          nodes.size(), attempt, join_timeout_.count(), min_nodes);
      store_->set_string(key(attempt, "plan"), "none: " + why);
      ZERO_THROW(InvalidArgument, "{}", why);
    }
    store_->set_string(key(attempt, "plan"), encode(nodes));
    store_->set_string("zerorun/current", std::to_string(attempt));
  }
  const std::string text = store_->get_string(key(attempt, "plan"), join_timeout_ + std::chrono::seconds(30));
  Plan plan = read_plan(attempt, text);
  if (plan.world == 0) return std::nullopt;
  return plan;
}

std::optional<JobBoard::Plan> JobBoard::join_running(int nproc) {
  const int attempt = current_attempt() + 1;
  enter(attempt, nproc);
  const std::string plan_key = key(attempt, "plan");
  while (!store_->check({plan_key})) {
    if (store_->check({"zerorun/over"})) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Plan plan = read_plan(attempt, store_->get_string(plan_key, join_timeout_));
  if (plan.world == 0) return std::nullopt;
  plan.attempt = attempt;
  return plan;
}

// The plan's text as this node sees it: world 0 when this node is not in it.
JobBoard::Plan JobBoard::read_plan(int attempt, const std::string& text) const {
  if (text.rfind("none: ", 0) == 0) ZERO_THROW(InvalidArgument, "node 0 could not form the job: {}", text.substr(6));
  Plan plan;
  plan.attempt = attempt;
  plan.nodes = decode(text);
  bool in = false;
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    if (plan.nodes[i].first == node_rank_) {
      in = true;
      plan.first_rank = plan.world;
      plan.node_index = static_cast<int>(i);
    }
    plan.world += plan.nodes[i].second;
  }
  if (!in) plan.world = 0;
  return plan;
}

int JobBoard::current_attempt() {
  if (!store_->check({"zerorun/current"})) return -1;
  return std::stoi(store_->get_string("zerorun/current", join_timeout_));
}

bool JobBoard::newcomer(int attempt) { return store_->add(key(attempt + 1, "joined"), 0) > 0; }

void JobBoard::end_job() { store_->set_string("zerorun/over", "1"); }

bool JobBoard::claim_failure(int attempt, const std::string& what) {
  const std::string text = fmt::format("node {}: {}", node_rank_, what);
  const Bytes after = store_->compare_set(key(attempt, "failed"), {}, Bytes(text.begin(), text.end()));
  return as_text(after) == text;
}

std::optional<std::string> JobBoard::failure(int attempt) {
  const std::string k = key(attempt, "failed");
  if (!store_->check({k})) return std::nullopt;
  return store_->get_string(k, join_timeout_);
}

void JobBoard::done(int attempt) { store_->set_string(key(attempt, fmt::format("done/{}", node_rank_)), "1"); }

void JobBoard::beat(int attempt, const Plan& plan) {
  if (attempt != seen_attempt_) {
    seen_.clear();  // each attempt's beats are its own (a node back in a later attempt starts anew)
    seen_attempt_ = attempt;
  }
  store_->add(key(attempt, fmt::format("alive/{}", node_rank_)), 1);
  const auto now = Clock::now();
  for (const auto& [node, n] : plan.nodes) {
    if (node == node_rank_) continue;
    const int64_t count = store_->add(key(attempt, fmt::format("alive/{}", node)), 0);
    if (count == 0) continue;  // not started yet: watched from its first beat
    if (store_->check({key(attempt, fmt::format("done/{}", node))})) {
      seen_.erase(node);  // finished: silent by right
      continue;
    }
    auto it = seen_.find(node);
    if (it == seen_.end() || it->second.first != count) seen_[node] = {count, now};
  }
}

std::vector<int> JobBoard::silent_nodes(const Plan& plan, std::chrono::milliseconds quiet) const {
  const auto now = Clock::now();
  std::vector<int> silent;
  for (const auto& [node, n] : plan.nodes) {
    if (node == node_rank_) continue;
    const auto it = seen_.find(node);
    if (it != seen_.end() && now - it->second.second > quiet) silent.push_back(node);
  }
  return silent;
}

void JobBoard::mark_lost(int attempt, int node) { store_->set_string(key(attempt, fmt::format("lost/{}", node)), "1"); }

std::vector<int> JobBoard::kept_nodes(int attempt, const Plan& plan) {
  std::vector<int> kept;
  for (const auto& [node, ranks] : plan.nodes) {
    if (!store_->check({key(attempt, fmt::format("lost/{}", node))})) kept.push_back(node);
  }
  return kept;
}

void JobBoard::wait_for_nodes(int attempt, const Plan& plan, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const auto& [node, n] : plan.nodes) {
    while (!store_->check({key(attempt, fmt::format("done/{}", node))}) && !failure(attempt) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace zero::comm
