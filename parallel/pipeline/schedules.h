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
//                    (weight gradient); W deferred into what would be bubbles, as far as memory
//                    allows: a list schedule (a forward and a B in 1F1B's rhythm, a forward only
//                    while fewer than p-s micro-batches are in flight, a W when nothing else runs)
//                    that keeps every rank's held activations within 1F1B's peak. With a forward and a deferred W holding
//                    the same (the default sizes), rank s holds p-s forwards and defers s W's, the
//                    paper's ZB-H1; bubble about a third of 1F1B's when F = B = W.
//   zb-v             zero bubble in a V (the paper's ZB-V, torch's ScheduleZBVZeroBubble's order): 2
//                    chunks per rank, rank s holding virtual stages s and 2p-1-s, so that rank 0 runs
//                    the first and the last and the backward turns on rank p-1 without a transfer.
//                    A warm-up of chunk-0 forwards (2(p-s)-1 on rank s), a steady phase of F, B, W
//                    of chunk 0 then of chunk 1, a cool-down of the B's and W's left. Rank 0 holds
//                    2p chunk forwards at most: 1F1B's peak on the same layers. Near-zero bubble
//                    when F = B = W and m >= 2p.
//
// The ZB-H1 generator takes the costs the simulator takes (schedule_sim.h's ActionCosts): each
// virtual stage's F, B and W time and a transfer's, and what a micro-batch holds (held: after a
// forward, and after an input part until its W); the defaults are a unit each. A run passes its
// model's sizes so that the bound holds in bytes, and its measured (or modelled) times so that the
// order fits them, as the paper's scheduler takes profiled ones (every rank must generate the same
// schedule: from the same numbers).
#include <string>

#include "parallel/pipeline/held_activations.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_sim.h"

namespace zero::parallel {

// Each throws InvalidArgument naming the parameter: p, m or v not positive; interleaved: m not a
// multiple of p, or `layers` (when positive) not a multiple of p x v.
Schedule gpipe(int ranks, int microbatches);
Schedule one_f_one_b(int ranks, int microbatches);
Schedule interleaved_1f1b(int ranks, int microbatches, int chunks, int layers = 0);
Schedule zb_h1(int ranks, int microbatches, const ActionCosts& costs = {});
Schedule zb_v(int ranks, int microbatches);

// 1F1B's peak of held activations on the same model: the p x v virtual stages merged into p stages
// of v consecutive ones (their forwards summed), run by one_f_one_b(p, m). The bound of the
// zero-bubble generators; with even stages, the first stage's p micro-batches.
double one_f_one_b_peak(const HeldBytes& held, int ranks, int chunks, int microbatches);

// Where the named schedule lays a rank's chunks: a V for "zb-v", else a loop.
Placement placement_of(const std::string& name);

// By name: "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v" (InvalidArgument listing them otherwise;
// for chunks other than 1 with a schedule that has one chunk per rank, other than 2 with zb-v).
// `costs` go to ZB-H1's generator.
Schedule make_schedule(const std::string& name, int ranks, int microbatches, int chunks = 1, int layers = 0,
                       const ActionCosts& costs = {});

}  // namespace zero::parallel
