#pragma once
// The checker of pipeline schedules (schedule.h), generated or written by hand. A schedule passes
// when
//   - every action names a micro-batch and chunk that exist, and uses the backward form the schedule
//     declares (B and W, or BW);
//   - every (micro-batch, chunk) of every rank has exactly one F, one B or BW, one W when split, and
//     exactly the transfers its virtual stage needs (a receive of its input and a send of its output
//     where the neighbouring virtual stage is on another rank, the same for gradients);
//   - every action comes after what it uses on its rank: F after its RecvF (or the rank's own
//     previous chunk), B after its F and its RecvB (or the rank's next chunk's B), W after its B,
//     a send after what it sends;
//   - each pair of ranks agrees, per direction and kind, on the order of its transfers (the k-th send
//     meets the k-th receive: Communicator::send/recv match in order);
//   - run with sends posted without waiting and receives waiting for their data (the runner's
//     semantics), no rank waits forever.
// The first problem found is thrown as InvalidArgument naming the rank, the micro-batch (and chunk)
// and the action: "pipeline schedule '1f1b': rank 2: W of micro-batch 1 comes before its B".
#include "parallel/pipeline/schedule.h"

namespace zero::parallel {

void check_schedule(const Schedule& schedule);

}  // namespace zero::parallel
