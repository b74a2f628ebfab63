#pragma once
// comm_bench's point-to-point rows: our Communicator::send/recv against Gloo's own pair transfers
// (unbound buffers on an identically built context) in the same run, between ranks 0 and 1.
#include <cstddef>
#include <memory>

#include <gloo/context.h>

#include "comm/communicator.h"

namespace zero::comm {

struct P2pRow {
  size_t bytes = 0;
  double ours_latency_us = 0, gloo_latency_us = 0;  // ping-pong: half a round trip
  double ours_stream_gbs = 0, gloo_stream_gbs = 0;  // one-way stream of kStreamDepth messages in flight
  size_t wrong = 0;                                 // bytes our transfers delivered wrong
};

inline constexpr int kStreamDepth = 8;

// Collective over `ours` (every rank calls it; ranks beyond 1 only join the timing's reductions).
// Our calls and Gloo's alternate one by one over `rounds` rounds, and each side's median is kept.
P2pRow bench_p2p(Communicator& ours, const std::shared_ptr<gloo::Context>& gctx, size_t bytes, int rounds);

void print_p2p_header();
void print_p2p_row(const P2pRow& row);

}  // namespace zero::comm
