#pragma once
// The layout a run goes on with after losing ranks (zerorun --max-restarts, docs/reliability.md):
// the planned model-parallel shape kept whole (tp, pp, the schedule and its chunks, the stage,
// offload, recompute, the mesh order), data parallelism shrunk to what the surviving world holds,
// and the global batch kept, so that the run trains on the same rows per step as planned.
//
// The micro-batch keeps its rows (the planned global batch / (dp x micro_batches)), so a rank's
// activation memory stays what the run was planned at; more micro-batches per data-parallel rank
// make up the batch. dp is the largest count the world holds for which the batch splits into whole
// micro-batches (and, for the interleaved schedule, into a multiple of pp of them); the ranks past
// dp x tp x pp are spares: the highest ones, which wait as replacements. A hybrid-sharding group
// keeps its size where it divides the new dp, else takes the largest size that does.
//
//   planned dp 4 x 3 micro-batches of 4 rows (batch 48), 3 ranks left: dp 3 x 4 micro-batches
//   planned dp 4 x 1 micro-batch of 12 rows (batch 48), 3 ranks left: 36 rows do not split 48, so
//     dp 2 x 2 micro-batches, and rank 2 is a spare

#include <string>

#include "layout/layout.h"

namespace zero {

struct ShrunkLayout {
  Layout layout;    // on layout.world() ranks: ranks 0 .. world() - 1
  int spares = 0;   // the world's other ranks
};

// `planned` (dp resolved) trained global batches of `global_batch` rows; `world` ranks are left.
// InvalidArgument "<source>: ..." naming the sizes when the planned batch does not split as
// planned, when the world cannot hold one tp x pp copy of the model, or when no dp splits the batch.
ShrunkLayout shrink_layout(const Layout& planned, int global_batch, int world, const std::string& source);

}  // namespace zero
