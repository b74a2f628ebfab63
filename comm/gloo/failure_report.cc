#include "comm/gloo/failure_report.h"

#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace zero::comm {

FailureReport::FailureReport(std::shared_ptr<Store> store, std::string prefix, int rank, int size,
                             std::chrono::milliseconds grace, std::vector<int> world_ranks)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size), grace_(grace),
      world_ranks_(std::move(world_ranks)) {}

std::string FailureReport::member(int rank) const {
  if (world_ranks_.empty() || rank < 0 || static_cast<size_t>(rank) >= world_ranks_.size()) return std::to_string(rank);
  return fmt::format("{} (world rank {})", rank, world_ranks_[static_cast<size_t>(rank)]);
}

std::string FailureReport::key(int rank) const { return fmt::format("{}/failed/{}", prefix_, rank); }

std::string FailureReport::p2p_key(int rank) const { return fmt::format("{}/p2p_failed/{}", prefix_, rank); }

void FailureReport::note_p2p_failure(const std::string& message) const {
  try {
    store_->compare_set(p2p_key(rank_), {}, Bytes(message.begin(), message.end()));
  } catch (const std::exception&) {
    // The peer's error then only says that the connection broke.
  }
}

std::string FailureReport::p2p_note(int peer) const {
  try {
    const auto deadline = std::chrono::steady_clock::now() + grace_;
    for (;;) {
      if (store_->check({p2p_key(peer)})) {
        return fmt::format(" (rank {} reported: {})", member(peer),
                           store_->get_string(p2p_key(peer), std::chrono::seconds(1)));
      }
      if (std::chrono::steady_clock::now() >= deadline) return {};
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception&) {
    return {};
  }
}

std::string FailureReport::absent_ranks(uint64_t seq, const std::string& note) const {
  if (size_ == 1 || grace_.count() <= 0) return {};
  std::vector<std::string> silent;
  std::vector<std::pair<int, uint64_t>> earlier;
  bool polled = false;
  try {
    const std::string mine = std::to_string(seq);
    store_->compare_set(key(rank_), {}, Bytes(mine.begin(), mine.end()));  // the first failure stays
    const auto deadline = std::chrono::steady_clock::now() + grace_;
    for (;;) {
      std::vector<std::string> now_silent;
      std::vector<std::pair<int, uint64_t>> now_earlier;
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        if (!store_->check({key(r)})) {
          now_silent.push_back(member(r));
          continue;
        }
        const uint64_t theirs = std::stoull(store_->get_string(key(r), std::chrono::seconds(1)));
        if (theirs < seq) now_earlier.emplace_back(r, theirs);
      }
      silent = std::move(now_silent);
      earlier = std::move(now_earlier);
      polled = true;
      if (silent.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception& e) {
    if (!polled) return fmt::format(" (the store could not tell which ranks reached it: {})", e.what());
  }
  std::vector<std::string> parts;
  if (!silent.empty()) {
    parts.push_back(fmt::format("rank{} {} did not reach it: exited, stalled, or stuck before it",
                                silent.size() > 1 ? "s" : "", fmt::join(silent, ", ")));
  }
  for (const auto& [r, theirs] : earlier) {
    parts.push_back(fmt::format("rank {} failed first, in #{}", member(r), theirs));
  }
  if (parts.empty()) parts.push_back("every rank reached it");
  return fmt::format(" ({}{})", fmt::join(parts, "; "), note);
}

}  // namespace zero::comm
