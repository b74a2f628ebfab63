#pragma once
// Megatron-LM's tensor-parallel region operators, as functions a hand-written model calls on its own
// float buffers with the mesh's tp communicator. A block half is
//
//     x (replicated) --f--> column-parallel linear --> nonlinearity --> row-parallel linear --g--> y
//
// f (CopyToTp) and g (ReduceFromTp) are conjugate: f is the identity forward and sums the ranks'
// partial input gradients backward; g sums the ranks' partial outputs forward and is the identity
// backward. So one all-reduce per block half in each direction, never the full weight on one rank.
//
// Sequence parallelism keeps the replicated activations between the regions (LayerNorm, dropout,
// residual) split along the sequence instead: f becomes GatherFromSequence (all-gather forward,
// reduce-scatter backward) and g becomes ReduceScatterToSequence (reduce-scatter forward, all-gather
// backward): the same bytes as the two all-reduces, and a tp-th of the activations.
//
// A sequence-split tensor is [outer, seq, inner] row-major (a [B, T, C] activation: outer = B,
// seq = T, inner = C) of which rank r holds the rows [r * seq / tp, (r + 1) * seq / tp) of every
// outer index, as a contiguous [outer, seq / tp, inner]. seq must divide by tp.
//
// Every call blocks until its collective completed; the buffers are the caller's.
#include <cstddef>

#include "comm/communicator.h"

namespace zero::parallel {

// The shape of a tensor split along its sequence dimension (the full tensor's sizes).
struct SequenceShape {
  size_t outer = 1;  // leading dimensions (the batch)
  size_t seq = 0;    // the split dimension
  size_t inner = 1;  // trailing dimensions (the hidden size)

  size_t full_count() const { return outer * seq * inner; }
  // Elements of one rank's part; throws InvalidArgument naming seq and tp when tp does not divide.
  size_t local_count(int tp) const;
};

// f: a replicated activation enters a tensor-parallel region.
struct CopyToTp {
  static void forward(comm::Communicator& /*tp*/, float* /*x*/, size_t /*count*/) {}
  // grad (count elements): this rank's partial gradient in, the sum over tp out.
  static void backward(comm::Communicator& tp, float* grad, size_t count);
};

// g: the ranks' partial outputs of a row-parallel layer leave the region, summed.
struct ReduceFromTp {
  // x (count elements): this rank's partial output in, the sum over tp out.
  static void forward(comm::Communicator& tp, float* x, size_t count);
  static void backward(comm::Communicator& /*tp*/, float* /*grad*/, size_t /*count*/) {}
};

// f under sequence parallelism.
struct GatherFromSequence {
  // local: this rank's [outer, seq/tp, inner]; full: [outer, seq, inner], the same on every rank.
  static void forward(comm::Communicator& tp, const float* local, float* full, const SequenceShape& shape);
  // full_grad: this rank's partial gradient of the full tensor; local_grad: the sum over tp of the
  // rows this rank holds (overwritten).
  static void backward(comm::Communicator& tp, const float* full_grad, float* local_grad,
                       const SequenceShape& shape);
};

// g under sequence parallelism.
struct ReduceScatterToSequence {
  // full: this rank's partial [outer, seq, inner]; local: the sum over tp of its rows (overwritten).
  static void forward(comm::Communicator& tp, const float* full, float* local, const SequenceShape& shape);
  // local_grad: this rank's rows of the gradient; full_grad: all of them (overwritten).
  static void backward(comm::Communicator& tp, const float* local_grad, float* full_grad,
                       const SequenceShape& shape);
};

}  // namespace zero::parallel
