#pragma once
// The engine's own collectives over its groups, apart from its front (engine.cc) and its stage's
// parts: that the groups can run on the device, that every rank of every group registered and
// configured the same thing, rank 0's initial values, and the end-of-step comparison of the calls
// each group issued. Private to the engine (engine.cc).
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "memory/device.h"
#include "zero/engine.h"
#include "zero/param_registry.h"

namespace zero {

// Construction: every group accepts the device's memory (InvalidArgument naming it otherwise).
void check_group_pairing(const EngineComms& comms, memory::Device& device, std::chrono::milliseconds timeout);

// finalize(): every rank of the shard, replica and tp groups registered the same parameters and has
// the same `fingerprint` (the options and the group sizes); InvalidArgument on every rank otherwise,
// with any rank's local registration error.
void check_groups_agree(const EngineComms& comms, ParamRegistry& registry,
                        const std::vector<std::pair<std::string, std::string>>& fingerprint, memory::Device& device,
                        std::chrono::milliseconds timeout);

// finalize(): rank 0's initial values in every rank's parameters, within the shard group, then from
// replica 0 to the others; across tp the replicated values are compared, not copied
// (zero/tp_replica_check.h).
void broadcast_initial_values(const EngineComms& comms, const ParamRegistry& registry, memory::Device& device,
                              std::chrono::milliseconds timeout);

// step(): each distinct group compares the calls it issued this step (comm::Communicator::verify_schedule).
void verify_group_schedules(const EngineComms& comms);

}  // namespace zero
