#include "comm/gloo/gloo_call_runner.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gloo/common/error.h>

#include "base/error.h"

namespace zero::comm {
namespace {

// Thrown out of a collective by the schedule check (the message is built by the caller).
struct ScheduleMismatch {};

// The outcome of the exception in flight (called from a catch block).
OpResult classify_failure(const std::string& what) {
  try {
    throw;
  } catch (const TimeoutError& e) {
    return {Outcome::kTimeout, fmt::format("{}: {}", what, e.what())};
  } catch (const gloo::IoException& e) {
    const std::string msg = e.what();
    if (msg.find("Timed out") != std::string::npos) {
      return {Outcome::kTimeout, fmt::format("{} timed out in Gloo: {}", what, msg)};
    }
    return {Outcome::kCommError, fmt::format("{} failed in Gloo: {}", what, msg)};
  } catch (const std::exception& e) {
    return {Outcome::kCommError, fmt::format("{} failed: {}", what, e.what())};
  } catch (...) {
    return {Outcome::kCommError, fmt::format("{} failed: unknown exception", what)};
  }
}

}  // namespace

GlooCallRunner::GlooCallRunner(std::shared_ptr<gloo::Context> context, const GlooOptions& options,
                               bool check, const TrafficTap* tap)
    : context_(std::move(context)), options_(options), check_(check), tap_(tap) {}

OpResult GlooCallRunner::run(const CallInfo& call, const CallPlan& plan, const std::string& what) {
  OpResult result = run_checked(call, plan, what);
  if (result.outcome != Outcome::kOk) {
    // The communicator is done for. Gloo may still be moving data of the failed collective
    // (a healthy peer's late "ready" notice starts a send from our caller's buffer; a late
    // message lands in it), and the caller may free those buffers as soon as it sees the
    // error, so every connection is closed before the work completes; after that Gloo touches
    // none of our buffers, and the peers fail at once instead of at their timeout.
    close_and_bury();
  }
  return result;
}

OpResult GlooCallRunner::run_checked(const CallInfo& call, const CallPlan& plan, const std::string& what) {
  constexpr size_t kHeader = CallPlan::kHeader;
  const int size = context_->size;
  DirectOptions d;
  d.tag = static_cast<uint32_t>(call.seq);
  d.deadline = SteadyClock::now() + options_.timeout;
  d.segment_bytes = options_.segment_bytes;
  d.depth = options_.segment_depth;
  d.gather_segment_bytes = options_.gather_segment_bytes;
  d.graveyard = &graveyard_;
  d.abort = &abort_;
  d.awaiting = &awaiting_;
  d.tap = tap_;
  awaiting_.store(-1, std::memory_order_relaxed);
  std::string mismatch;
  // Compares the headers in the message area (one per rank, `capacity()` apart).
  auto compare = [&](const uint8_t* area) {
    std::vector<CallRecord> all(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) std::memcpy(all[r].data(), area + r * capacity(), kHeader);
    mismatch = find_schedule_mismatch(all);
    if (!mismatch.empty()) throw ScheduleMismatch{};
  };
  const CallRecord mine = encode_call(call);
  uint8_t* area = messages_.get(static_cast<size_t>(size) * capacity());
  try {
    if (plan.small()) {
      exchange_messages(*context_, mine.data(), kHeader, plan.payload, area, capacity(),
                        message_sends_, d);
      if (check_) compare(area);
      plan.apply(area, capacity());
      return {Outcome::kOk, {}};
    }
    // The check's records: posted by check_start (or by `check` itself when the collective
    // has no use for an early start), waited for and compared by `check`.
    std::optional<MessageRound> round;
    DirectOptions c = d;
    auto check_start = [&] {
      round.emplace(*context_, mine.data(), kHeader, nullptr, area, capacity(), message_sends_,
                    c);
    };
    auto check = [&] {
      if (!round) check_start();
      round->finish();
      compare(area);
    };
    if (check_ && plan.check_after_sends) {
      d.check_start = check_start;
      d.after_sends = check;
    } else if (check_) {
      d.before_sends = check;
    }
    plan.run(*context_, d, scratch_);
    return {Outcome::kOk, {}};
  } catch (const ScheduleMismatch&) {
    // Best effort, bounded: the mismatch is reported whatever becomes of this round.
    try {
      DirectOptions v;
      v.tag = d.tag;
      v.deadline = std::min(d.deadline, SteadyClock::now() + std::chrono::seconds(10));
      v.graveyard = &graveyard_;
      v.abort = &abort_;
      confirm_verdict(*context_, v);
    } catch (...) {
    }
    return {Outcome::kCommError, fmt::format("{}: {}", what, mismatch)};
  } catch (...) {
    if (abort_.tripped()) return {Outcome::kCommError, fmt::format("{} aborted: {}", what, abort_reason())};
    return classify_failure(what);
  }
}

void GlooCallRunner::cut_short(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  abort_.trip();
  abort_connections(*context_);
}

std::string GlooCallRunner::abort_reason() const {
  std::lock_guard<std::mutex> lock(abort_mu_);
  return abort_reason_;
}

std::string GlooCallRunner::awaited_peer() const {
  const int p = awaiting_.load(std::memory_order_relaxed);
  return p < 0 ? std::string() : fmt::format("; this rank was waiting for rank {}'s data", p);
}

void GlooCallRunner::bury() {
  if (!graveyard_.empty()) close_and_bury();
}

void GlooCallRunner::close_and_bury() {
  context_->closeConnections();
  graveyard_.clear();
}

}  // namespace zero::comm
