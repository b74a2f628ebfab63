#pragma once
// NCCL backend: collectives over CUDA device memory. Compiled only under --config=cuda (the
// implementation needs cuda_runtime.h and nccl.h); this header names no CUDA type, so CPU code may
// include it and ask nccl_available(), which is false in a CPU build.
//
// Rendezvous: rank 0 creates the ncclUniqueId and publishes it through the Store; every rank then
// calls ncclCommInitRank on its device (NcclOptions.device, else the current one). Collectives run
// on the communicator's own stream, ordered after the caller's work: each call records an event on
// the caller's stream (the one the issuing thread named on this communicator with
// Communicator::set_issue_stream, else the legacy default stream) and makes the NCCL stream wait
// on it.
// Work::wait_stream(s) makes s wait for the collective without blocking the host; Work::wait(t)
// polls the completion event and ncclCommGetAsyncError until t, then aborts the communicator
// (ncclCommAbort) and throws TimeoutError; an NCCL error throws CommError. Both name the op, its
// sequence number and the rank, and leave the communicator failed (later calls throw CommError).
//
// Point-to-point: send/recv queue their transfer (ordered after the caller's stream at issue, like a
// collective) and launch every queued transfer as one ncclGroupStart/End group at the first wait
// on any of them, the next collective, or split, so that a rank sending to and receiving from a
// peer at once cannot block its own stream. They are numbered per peer and direction for their
// messages; the schedule check does not pair them on NCCL yet (docs/comm.md, "Point-to-point").
//
// The schedule check is deferred (comm/schedule_ledger.h): each call is recorded, and the ranks
// compare a digest of their calls where the caller already waits (verify_schedule, at the step's
// end) and their recent calls through the store when a wait times out; nothing waits per call.
// NcclOptions::check_every_call compares each call before it runs instead (a host wait per call);
// ZERO_COMM_CHECK=0 turns both off.
#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/store/store.h"

namespace zero::comm {

struct NcclOptions {
  // CUDA device ordinal; -1 keeps the calling thread's current device.
  int device = -1;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  bool check_schedule = true;
  // The schedule check on every call (a record all-gathered and read back on the host before each
  // collective: exact at the call, but a host wait per call) instead of the deferred one (calls
  // recorded; compared at Communicator::verify_schedule and when a wait times out).
  bool check_every_call = false;
  std::string prefix = "nccl";

  void validate() const;
};

// True in a --config=cuda build.
bool nccl_built();
// Visible CUDA devices; 0 in a CPU build or without a driver.
int cuda_device_count();
// nccl_built() and at least one device.
bool nccl_available();

// Throws InvalidArgument in a build without CUDA.
std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Store> store, int rank,
                                                     int size, const NcclOptions& options = {});

}  // namespace zero::comm
