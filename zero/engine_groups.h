#pragma once
// The engine's own collectives over its groups, apart from its front (engine.cc) and its stage's
// parts: that the groups can run on the device, that every rank of every group registered and
// configured the same thing, rank 0's initial values, and the end-of-step comparison of the calls
// each group issued. The gradient finalizers' groups (zero/grad_finalizer.h) are among them; what
// each finalizer does over its own group is its own. Private to the engine (engine.cc).
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "memory/device.h"
#include "zero/engine.h"
#include "zero/grad_finalizer.h"
#include "zero/param_registry.h"

namespace zero {

// Construction: the data-parallel groups and the norm group accept the device's memory
// (InvalidArgument naming it otherwise), and each finalizer is bound to the device (checking its own).
void bind_groups(const EngineComms& comms, memory::Device& device, std::chrono::milliseconds timeout);

// The group across which the registered parameters are split, each rank holding a slice (the
// checkpoint's): the first finalizer's that splits any; null: none.
comm::Communicator* split_group(const EngineComms& comms);

// finalize(), before the agreement: a parameter that needs a finalizer (needs_finalizer()) that
// none of the engine's claims, noted on the registry for its cross-rank report.
void check_claimed(const GradFinalizers& finalizers, ParamRegistry& registry);

// A rule that needs whole tensors (CustomOptimizer::needs_whole_tensors: LAMB's trust ratio, an
// orthogonalizing rule) would see only this rank's slice of a tensor a finalizer splits across
// several ranks, and train silently unlike the unsplit model, unless the finalizer gathers it whole
// at update time (GradFinalizer::split; tensor parallelism's does): refused otherwise, noted
// on the registry naming the parameter and the finalizer.
void check_whole_tensor_rule(const EngineOptions& options, const GradFinalizers& finalizers, ParamRegistry& registry);

// finalize(): every rank of the shard and replica groups, and of each finalizer's group where it
// asks for it (same_registration()), registered the same parameters and has the same
// `fingerprint` (the options and the group sizes); InvalidArgument on every rank otherwise, with
// any rank's local registration error.
void check_groups_agree(const EngineComms& comms, ParamRegistry& registry,
                        const std::vector<std::pair<std::string, std::string>>& fingerprint, memory::Device& device,
                        std::chrono::milliseconds timeout);

// finalize(): rank 0's initial values in every rank's parameters, within the shard group, then from
// replica 0 to the others.
void broadcast_initial_values(const EngineComms& comms, const ParamRegistry& registry, memory::Device& device,
                              std::chrono::milliseconds timeout);

// step(): each distinct group compares the calls it issued this step (comm::Communicator::verify_schedule).
void verify_group_schedules(const EngineComms& comms);

}  // namespace zero
