#pragma once
// The engine's groups and gradient finalizers from a rank's place in the device mesh, so that none
// can be left out and none is passed one by one:
//
//   comm::Mesh mesh(world, comm::MeshShape{.pp = 2, .dp = 2, .tp = 2});
//   zero::Engine engine(zero::parallel::engine_comms(mesh), options);
//
// zero/ knows the finalizers' interface only (zero/grad_finalizer.h); the rules live here, with the
// parallelisms that need them.
#include "comm/communicator.h"
#include "comm/hybrid_groups.h"
#include "comm/mesh.h"
#include "memory/device.h"
#include "zero/engine.h"

namespace zero::parallel {

// Model parallelism's finalizers, in the order the engine runs them: tensor parallelism's over `tp`
// (of any size: a model written with split placements runs at tp 1 unchanged) and, where this rank
// holds tied copies' group (`tied`: the first and the last pipeline stage; null elsewhere), the
// tied copies'. The groups must outlive the engine.
GradFinalizers model_parallel_finalizers(comm::Communicator& tp, comm::Communicator* tied);

// Every field of EngineComms from `mesh`: the data-parallel group (split into shard and replica
// groups for HSDP by the mesh's own, from its layout's shard, or by `hybrid`, built over mesh.dp()),
// the norm group (mesh.model_parallel(): tp x pp), model_parallel_finalizers(mesh.tp(),
// mesh.embedding()) and the mesh's layout. The mesh (and `hybrid`, `device`)
// must outlive the engine; call it once per engine (a finalizer serves one).
EngineComms engine_comms(const comm::Mesh& mesh, const comm::HybridGroups* hybrid = nullptr,
                         memory::Device* device = nullptr);

}  // namespace zero::parallel
