#pragma once
// Which ranks never reached a failed collective, for the failure's message: the forensics a Gloo
// communicator runs through the store once a collective has failed (or been given up on). Costs
// nothing on the way that works: the store is touched only after a failure.
//
// Every rank that fails a collective writes the sequence number of its first failure under its
// own key, then waits a moment (the grace) for the others' reports:
//   a rank that stays silent          exited, stalled, or is stuck before the call;
//   a rank that reports an earlier #  failed first (a dying peer can cut the ranks off at different
//                                     collectives);
//   a rank that reports this # or later reached it.
// A rank still blocked in an earlier collective on the dead one is silent too until its own
// deadline: the report then lists it beside the dead rank ("ranks 0, 1 did not reach it").
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace zero::comm {

class FailureReport {
 public:
  // `prefix`: the communicator's own (unique per instance), under which the reports are kept.
  // `world_ranks`: for a communicator split from another, each member's rank in the world, so that
  // the reports name "rank 1 (world rank 3)"; empty for the world itself.
  FailureReport(std::shared_ptr<Store> store, std::string prefix, int rank, int size,
                std::chrono::milliseconds grace, std::vector<int> world_ranks = {});

  // Records that this rank failed collective `seq` (only its first failure stays), polls the
  // others' reports for up to the grace, and returns " (rank 1 did not reach it: ...; rank 2 failed
  // first, in #9<note>)" for the error message; "" with one rank or no grace. Never throws: when
  // the store fails (it lives in a rank, which may exit once it has reported), the last complete
  // poll is the answer, or the message says the store could not tell.
  std::string absent_ranks(uint64_t seq, const std::string& note = {}) const;

  // Point-to-point transfers involve one peer, so the forensics are a note instead: a rank whose
  // transfer fails leaves its message in the store (the first one stays) before it closes its
  // connections, and a rank whose connection to `peer` then breaks reads it, so that its error says
  // why the peer went (" (rank 1 reported: ... timed out waiting for rank 0 ...)") instead of
  // guessing that it died. Neither throws; p2p_note looks once, then polls for up to the grace,
  // and returns "" when no note came.
  void note_p2p_failure(const std::string& message) const;
  std::string p2p_note(int peer) const;

 private:
  std::string key(int rank) const;
  std::string member(int rank) const;  // "1", or "1 (world rank 3)" in a split communicator
  std::string p2p_key(int rank) const;

  std::shared_ptr<Store> store_;
  std::string prefix_;
  int rank_, size_;
  std::chrono::milliseconds grace_;
  std::vector<int> world_ranks_;
};

}  // namespace zero::comm
