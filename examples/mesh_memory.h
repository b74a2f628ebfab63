#pragma once
// What a training program over a device mesh prints about memory: the largest rank's at a step, and
// every rank's report at the end (train_gpt, train_torch_gpt).
#include "comm/mesh.h"
#include "zero/engine.h"

namespace zero::examples {

// Collective over the mesh's world: the largest rank's engine memory (current and peak) and process
// memory (RSS, current and peak), printed by rank 0 as "memory at step N | ..." (the soak run reads
// these lines to show memory steady after warm-up).
void report_memory(Engine& engine, const comm::Mesh& mesh, int step);
// Collective: every rank's memory report in world rank order, each headed by its mesh coordinate
// under model parallelism (the engine's table names its data-parallel rank).
void print_memory_tables(Engine& engine, const comm::Mesh& mesh);

}  // namespace zero::examples
