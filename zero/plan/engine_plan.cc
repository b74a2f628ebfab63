#include "zero/plan/engine_plan.h"

#include <fmt/format.h>

#include <vector>

#include "base/check.h"
#include "memory/meta_device.h"
#include "zero/engine.h"

namespace zero::plan {
namespace {

// Unit ids in first-registration order, and each unit's trainable parameter ids.
struct Units {
  std::vector<int> order;
  std::map<int, std::vector<int>> params;
};

// One micro-step: every unit gathered for forward in order, then for backward in reverse, each
// trainable gradient asked for (which is what allocates the reducer's buffers), nothing computed.
void empty_micro_step(Engine& engine, const Units& units) {
  for (int u : units.order) {
    UnitScope s = engine.gather(u);
  }
  for (auto it = units.order.rbegin(); it != units.order.rend(); ++it) {
    UnitScope s = engine.gather_for_backward(*it);
    for (int id : units.params.at(*it)) (void)s.grad(id);
  }
  engine.finish_backward();
}

}  // namespace

uint64_t EnginePlan::wire_bytes() const {
  uint64_t n = 0;
  for (const auto& [op, t] : traffic) n += t.wire_bytes;
  return n;
}

EnginePlan plan_engine(const PlanInputs& in) {
  if (in.world_size < 1 || in.rank < 0 || in.rank >= in.world_size) {
    ZERO_THROW(InvalidArgument, "plan: rank {} of world size {}", in.rank, in.world_size);
  }
  memory::MemoryTracker tracker;
  auto meta = memory::make_meta_device(tracker, in.cuda ? memory::Location::cuda(0) : memory::Location::host());
  comm::PlanningCommunicator comm(
      in.rank, in.world_size, [&meta](const void* p, size_t n) { return meta->addressable(p, n); }, meta->kind());
  EngineOptions options = in.options;
  Engine engine(EngineComms{&comm, nullptr, meta.get()}, options);
  Units units;
  for (const TensorSpec& t : in.model.tensors) {
    const size_t numel = shape_numel(t.shape);
    void* data = meta->reserve_unbacked(numel * dtype_size(in.model.dtype));
    const int id = engine.add_param({.name = t.name, .shape = t.shape, .dtype = in.model.dtype, .data = {data, numel},
                                     .unit = t.unit, .group = t.group, .requires_grad = t.trainable});
    if (!units.params.count(t.unit)) units.order.push_back(t.unit);
    auto& list = units.params[t.unit];
    if (t.trainable) list.push_back(id);
  }
  engine.finalize();
  const int micro = options.gradient_accumulation_steps;
  for (int step = 0; step < 2; ++step) {
    if (step == 1) comm.reset_tallies();  // the second step: prefetch order recorded, buffers warm
    for (int m = 0; m < micro; ++m) empty_micro_step(engine, units);
    engine.step();
  }
  EnginePlan plan;
  plan.traffic = comm.tallies();
  plan.memory = engine.memory_report();
  plan.device_peak = tracker.peak_total();
  for (const MemoryReport::Row& r : plan.memory.rows) {
    if (r.host_tier) plan.host_tier_peak += r.peak;
  }
  if (!in.cuda) {
    // The whole run's calls (finalize's agreements included) size the scratch, as in a real run.
    comm::GlooScratchPlan scratch(in.gloo, in.world_size, in.rank);
    for (const comm::PlannedCall& c : comm.calls()) scratch.add_call(c.kind, c.count, c.dtype);
    plan.comm_scratch = scratch.bytes();
  }
  for (MemoryReport::Row& r : plan.memory.rows) {
    if (r.category == "comm (process)") r.current = r.peak = plan.comm_scratch;
  }
  return plan;
}

std::string EnginePlan::table() const {
  std::string s = memory.table();
  s += fmt::format("  {:<18} {:>12}\n", "device peak", memory::format_bytes(device_peak));
  if (host_tier_peak > 0) s += fmt::format("  {:<18} {:>12}\n", "host tier", memory::format_bytes(host_tier_peak));
  s += fmt::format("traffic per step (rank {}): {} sent\n", memory.rank, memory::format_bytes(wire_bytes()));
  for (const auto& [op, t] : traffic) {
    s += fmt::format("  {:<16} {:>6} calls {:>12} payload {:>12} sent\n", op, t.calls,
                     memory::format_bytes(t.payload_bytes), memory::format_bytes(t.wire_bytes));
  }
  return s;
}

}  // namespace zero::plan
