#pragma once
// Gloo backend: collectives over host memory on Gloo's TCP transport.
//
// Each communicator owns a full-mesh Gloo context (rendezvous through our Store under a unique key
// prefix) and one worker thread. Calls validate their arguments on the caller's thread (throwing
// InvalidArgument naming the op and the argument), get the next sequence number, and queue the
// collective; the worker runs them one at a time in issue order while the caller computes. With the
// schedule check on (default; ZERO_COMM_CHECK=0 or check_schedule=false turns it off) every rank
// sends a 64-byte description of the call to every other rank before any data (comm/schedule_check.h);
// calls of at most eager_bytes per message send it as the header of a single round of data
// messages, larger ones overlap it with posting their receives (docs/comm.md).
//
// Failures: a Gloo error (a peer died, a connection broke, Gloo's own timeout) or a schedule mismatch
// completes the Work with CommError/TimeoutError naming the op, its sequence number and the rank, and
// marks the communicator failed: queued and later calls fail fast with CommError. Work::wait(timeout)
// past its deadline throws TimeoutError, cuts the collective short and fails the communicator (as
// NCCL's abort does).
// Every Gloo wait is bounded by `timeout`, so the destructor (which drains the queue) is bounded too.
//
// send/recv run beside the queue, not in it, on the same context (comm/gloo/gloo_p2p.h): a transfer
// never waits behind collectives, and a failure of either fails both.
#include <memory>

#include "comm/communicator.h"
#include "comm/gloo/gloo_options.h"
// GlooScratchPlan, the planner's account of this communicator's scratch memory, for the callers
// that reach it through this header.
#include "comm/gloo/gloo_scratch_plan.h"
#include "comm/store/store.h"

namespace zero::comm {

// Collective over `size` processes (each calls it with its own rank). Blocks until every rank has
// connected (or `timeout`). All ranks must agree on the schedule check setting (verified here).
std::unique_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Store> store, int rank,
                                                     int size, const GlooOptions& options = {});

}  // namespace zero::comm
