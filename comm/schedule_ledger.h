#pragma once
// The schedule check without an exchange per call, for a backend whose per-call check would block
// the host on every call (NCCL: a record all-gathered and read back before each collective). Each
// call the communicator issues is recorded in its ledger instead: a running digest of the calls
// since the ranks last agreed, and the last `history` records. The ranks compare where the caller
// already waits (Communicator::verify_schedule, at the step's end: one all-gather of the digests),
// and when a call times out (a mismatch usually hangs first) the recent records are compared through
// the store. Either way the message names both calls, as the per-call check's does:
//   schedule mismatch: rank 0 called all_reduce(bf16, 4096, sum) #41 but rank 1 called
//   all_gather(bf16, 2048) #41
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "comm/schedule_check.h"
#include "comm/store/store.h"

namespace zero::comm {

class ScheduleLedger {
 public:
  explicit ScheduleLedger(size_t history = 256);

  void record(const CallInfo& call);
  // The calls recorded since the last agreement (mark), as a digest and a count: equal on every rank
  // exactly when they issued the same calls (the digest chains each call's hash and number).
  uint64_t digest() const { return digest_; }
  uint64_t calls() const { return calls_; }
  // The ranks agreed up to here: the next digest starts from nothing.
  void mark();
  // The last `history` records, oldest first.
  std::vector<CallRecord> recent() const { return {recent_.begin(), recent_.end()}; }

 private:
  size_t history_;
  uint64_t digest_ = 0, calls_ = 0;
  std::deque<CallRecord> recent_;
};

// The ranks' recent records (indexed by rank, each oldest first) compared call by call: the first
// call number at which a rank's record differs from rank 0's, or one of them issued none, named
// with both calls; "" when every call they all still hold agrees (ranks whose digests differed then
// diverged before the oldest record kept: kDivergedEarlier says so).
std::string find_ledger_mismatch(const std::vector<std::vector<CallRecord>>& recent);

constexpr const char* kDivergedEarlier =
    "schedule mismatch: the ranks issued different calls before the oldest of the recent calls each keeps "
    "(those agree)";

// Every rank publishes its recent records at `key_prefix` + "/" + rank and reads the others',
// waiting at most `timeout` for each: find_ledger_mismatch's message, or one naming the ranks that
// did not publish in time (a rank that is hung elsewhere, or gone).
std::string compare_through_store(Store& store, const std::string& key_prefix, int rank, int size,
                                  const ScheduleLedger& ledger, std::chrono::milliseconds timeout);

}  // namespace zero::comm
