#pragma once
// The engine's checks of the tensor-parallel placements at finalize(): the two wirings that would
// otherwise train silently wrong.
//
// A parameter registered replicated over tp (ParamSpec::tp left at its default) is one tensor that
// every tp rank holds whole, so every tp rank must hold the same values. A tensor split across tp
// but registered without its split placement holds a different part on each rank: copying tp rank
// 0's values over the others (what a data-parallel broadcast would do) trains rank 0's part
// everywhere, and counting it once in the norm is wrong too. So across tp the engine compares,
// it does not copy: differing values are refused naming the parameter.
//
// A split placement without a tp group is the converse: the engine could neither count the parts
// nor sum partial gradients.
#include <chrono>
#include <string>

#include "comm/communicator.h"
#include "memory/device.h"
#include "zero/param_registry.h"

namespace zero {

// The error for the first parameter with a split placement, for an engine without a tp group
// ("" when there is none).
std::string split_without_tp_group(const ParamRegistry& registry);

// Collective over `tp`: every replicated parameter's values (read through `device`, after the
// compute stream's work) compared bit for bit with tp rank 0's; InvalidArgument on every rank naming
// the first parameter that differs and the tp ranks that hold other values.
void check_tp_replicas(comm::Communicator& tp, const ParamRegistry& registry, memory::Device& device,
                       std::chrono::milliseconds timeout);

}  // namespace zero
