#pragma once
// Internal: the checks optim::Optimizer applies to its options, segments and step inputs, shared with
// optim::cuda::CudaOptimizer so that both accept exactly the same inputs with the same messages.
// Implemented in optimizer.cc. Not part of the public API.
#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

#include "optim/optimizer.h"

namespace zero::optim::detail {

// The state arrays of `kind`, in Optimizer::state_names() order.
std::vector<std::string> state_names_of(OptimizerKind kind);

// kind, groups (validate_hyper for each) and state_dtype; throws InvalidArgument naming the field.
// num_threads and simd_path are the CPU optimizer's own (see Optimizer's constructor).
void validate_common_options(const OptimizerOptions& options);

// Every group runs options.kind, an elementwise rule (the single-kind optimizers' precondition);
// InvalidArgument naming the group and `who` otherwise.
void require_one_elementwise_kind(const OptimizerOptions& options, const char* who);

// Segment indices of each parameter (padding and empty segments left out), sorted by param_offset.
using SegmentsByParam = std::unordered_map<std::string, std::vector<size_t>>;

// Checks the segments (begin > end, end > shard_numel, group out of range, overlapping segments,
// two segments holding the same elements of one parameter); throws InvalidArgument naming the
// segment indices. Returns the segments of each parameter.
SegmentsByParam validate_segments(const std::vector<Segment>& segments, size_t shard_numel,
                                  int num_groups);

// Checks a step's input for `n` elements: dtypes, the optional lengths (against `what`, e.g.
// "shard_numel"), null pointers and a finite grad_scale.
void check_step_input(const StepInput& in, size_t n, const char* what);

}  // namespace zero::optim::detail
