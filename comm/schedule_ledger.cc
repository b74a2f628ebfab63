#include "comm/schedule_ledger.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "base/check.h"
#include "base/error.h"

namespace zero::comm {

ScheduleLedger::ScheduleLedger(size_t history) : history_(history) {
  ZERO_CHECK(history_ >= 1, "a schedule ledger keeps at least one call");
}

void ScheduleLedger::record(const CallInfo& call) {
  // FNV-1a over (the previous digest, the call's hash, its number): an order-sensitive chain.
  const uint64_t parts[3] = {digest_, call_hash(call), call.seq};
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const uint8_t*>(parts);
  for (size_t i = 0; i < sizeof parts; ++i) {
    h ^= bytes[i];
    h *= 1099511628211ull;
  }
  digest_ = h;
  ++calls_;
  recent_.push_back(encode_call(call));
  if (recent_.size() > history_) recent_.pop_front();
}

void ScheduleLedger::mark() {
  digest_ = 0;
  calls_ = 0;
}

std::string find_ledger_mismatch(const std::vector<std::vector<CallRecord>>& recent) {
  ZERO_CHECK(!recent.empty(), "no ranks' calls to compare");
  // Each rank's records by call number, and the span every rank still holds.
  std::vector<std::map<uint64_t, CallRecord>> by_seq(recent.size());
  uint64_t first = 0, last = 0;
  bool any = false;
  for (size_t r = 0; r < recent.size(); ++r) {
    for (const CallRecord& record : recent[r]) by_seq[r][decode_call(record).seq] = record;
    if (by_seq[r].empty()) continue;
    first = any ? std::max(first, by_seq[r].begin()->first) : by_seq[r].begin()->first;
    last = any ? std::max(last, by_seq[r].rbegin()->first) : by_seq[r].rbegin()->first;
    any = true;
  }
  if (!any) return {};
  for (uint64_t seq = first; seq <= last; ++seq) {
    const auto mine = by_seq[0].find(seq);
    for (size_t r = 1; r < by_seq.size(); ++r) {
      const auto theirs = by_seq[r].find(seq);
      if (mine == by_seq[0].end() && theirs == by_seq[r].end()) continue;
      if (mine == by_seq[0].end() || theirs == by_seq[r].end()) {
        const bool zero_has = mine != by_seq[0].end();
        return fmt::format("schedule mismatch: rank {} called {} but rank {} issued no call #{}", zero_has ? 0 : r,
                           describe_call(decode_call(zero_has ? mine->second : theirs->second)), zero_has ? r : 0, seq);
      }
      const CallInfo a = decode_call(mine->second), b = decode_call(theirs->second);
      if (!same_call(a, b)) {
        return fmt::format("schedule mismatch: rank 0 called {} but rank {} called {}", describe_call(a), r,
                           describe_call(b));
      }
    }
  }
  return {};
}

std::string compare_through_store(Store& store, const std::string& key_prefix, int rank, int size,
                                  const ScheduleLedger& ledger, std::chrono::milliseconds timeout) {
  const std::vector<CallRecord> mine = ledger.recent();
  Bytes out(mine.size() * kCallRecordBytes);
  for (size_t i = 0; i < mine.size(); ++i) std::memcpy(out.data() + i * kCallRecordBytes, mine[i].data(), kCallRecordBytes);
  store.set(fmt::format("{}/{}", key_prefix, rank), out);
  std::vector<std::vector<CallRecord>> all(static_cast<size_t>(size));
  all[static_cast<size_t>(rank)] = mine;
  std::vector<int> silent;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    Bytes in;
    try {
      in = store.get(fmt::format("{}/{}", key_prefix, r), timeout);
    } catch (const TimeoutError&) {
      silent.push_back(r);
      continue;
    }
    if (in.size() % kCallRecordBytes != 0) {
      return fmt::format("rank {} published {} bytes of calls, not a multiple of {}", r, in.size(), kCallRecordBytes);
    }
    for (size_t at = 0; at < in.size(); at += kCallRecordBytes) {
      CallRecord record;
      std::memcpy(record.data(), in.data() + at, kCallRecordBytes);
      all[static_cast<size_t>(r)].push_back(record);
    }
  }
  if (!silent.empty()) {
    return fmt::format("rank(s) {} did not publish their calls within {} ms", fmt::join(silent, ", "), timeout.count());
  }
  return find_ledger_mismatch(all);
}

}  // namespace zero::comm
