#include "examples/mesh_memory.h"

#include <cstdio>

#include "examples/process_memory.h"
#include "memory/tracker.h"

namespace zero::examples {

void report_memory(Engine& engine, const comm::Mesh& mesh, int step) {
  const memory::MemoryTracker& t = engine.device().tracker();
  const ProcessMemory pm = process_memory();
  double m[4] = {static_cast<double>(t.current_total()), static_cast<double>(t.peak_total()), static_cast<double>(pm.rss),
                 static_cast<double>(pm.peak_rss)};
  mesh.world().all_reduce(m, 4, DType::kFloat64, comm::ReduceOp::kMax)->wait();
  if (mesh.world().rank() != 0) return;
  auto bytes = [](double b) { return memory::format_bytes(static_cast<uint64_t>(b)); };
  std::printf("memory at step %d | engine %s (peak %s) | rss %s (peak %s) | largest rank\n", step, bytes(m[0]).c_str(),
              bytes(m[1]).c_str(), bytes(m[2]).c_str(), bytes(m[3]).c_str());
}

void print_memory_tables(Engine& engine, const comm::Mesh& mesh) {
  comm::Communicator& world = mesh.world();
  world.barrier()->wait();
  for (int r = 0; r < world.size(); ++r) {
    if (r == world.rank()) {
      if (mesh.shape().world_size() != mesh.shape().dp) {
        std::printf("memory of world rank %d (dp %d, tp %d, pp %d):\n", r, mesh.coord().dp, mesh.coord().tp,
                    mesh.coord().pp);
      }
      std::printf("%s", engine.memory_report().table().c_str());
      std::fflush(stdout);
    }
    world.barrier()->wait();
  }
}

}  // namespace zero::examples
