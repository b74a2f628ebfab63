#pragma once
// The named pipeline schedules, generated as data (schedule.h). Every generator places the transfers
// around the compute: a receive right before the action that uses it, a send right after the one
// that produces it (the runner posts receives earlier and overlaps; the order is what the two
// ranks of a transfer must agree on).
//
//   GPipe            every forward, then every backward (BW). Bubble (p-1)/(m+p-1) of the step;
//                    m micro-batches of activations held.
//   1F1B             PipeDream-Flush: rank s runs p-s-1 forwards, then one forward and one backward
//                    in turn, then the remaining backwards. GPipe's bubble, at most p-s in flight.
//   interleaved      Megatron's interleaved 1F1B: v chunks per rank (virtual stage c*p + s), the
//                    forwards in groups of p micro-batches per chunk, the warm-up
//                    (p-s-1)*2 + (v-1)*p. Bubble divided by v; m a multiple of p.
//   zb-h1            zero bubble (arXiv 2401.10241): the backward split into B (input gradient) and W
//                    (weight gradient); W deferred into what would be bubbles. Generated as a list
//                    schedule with unit costs: B first, then a forward while fewer than p-s
//                    micro-batches are in flight (1F1B's bound), then a W; a rank defers at most p-1
//                    W's. Bubble about a third of 1F1B's when F = B = W.
#include <string>

#include "parallel/pipeline/schedule.h"

namespace zero::parallel {

// Each throws InvalidArgument naming the parameter: p, m or v not positive; interleaved: m not a
// multiple of p, or `layers` (when positive) not a multiple of p x v.
Schedule gpipe(int ranks, int microbatches);
Schedule one_f_one_b(int ranks, int microbatches);
Schedule interleaved_1f1b(int ranks, int microbatches, int chunks, int layers = 0);
Schedule zb_h1(int ranks, int microbatches);

// By name: "gpipe", "1f1b", "interleaved", "zb-h1" (InvalidArgument listing them otherwise; and
// for chunks other than 1 with a schedule that has one chunk per rank).
Schedule make_schedule(const std::string& name, int ranks, int microbatches, int chunks = 1, int layers = 0);

}  // namespace zero::parallel
