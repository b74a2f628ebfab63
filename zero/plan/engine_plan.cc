#include "zero/plan/engine_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "base/check.h"
#include "memory/meta_device.h"
#include "zero/engine.h"

namespace zero::plan {
namespace {

// One micro-step of `schedule` on the engine, `micro_batches` times over (a pipeline stage's
// micro-batches, one after another): scopes opened and closed, gradients asked for, nothing
// computed. `ids`: the engine's parameter id of each tensor.
void run_micro_step(Engine& engine, const std::vector<ScopeEvent>& schedule, const std::vector<int>& ids,
                    int micro_batches) {
  std::map<int, std::optional<UnitScope>> open;
  for (int mb = 0; mb < micro_batches; ++mb) {
    for (const ScopeEvent& e : schedule) {
      switch (e.kind) {
        case ScopeEvent::kOpen:
          if (open[e.unit]) ZERO_THROW(InvalidArgument, "plan schedule: unit {} opened twice", e.unit);
          open[e.unit].emplace(e.backward ? engine.gather_for_backward(e.unit) : engine.gather(e.unit));
          break;
        case ScopeEvent::kGrad: {
          auto it = open.find(e.unit);
          if (it == open.end() || !it->second) {
            ZERO_THROW(InvalidArgument, "plan schedule: gradient of tensor {} asked for outside unit {}'s scope",
                       e.tensor, e.unit);
          }
          (void)it->second->grad(ids.at(e.tensor));
          break;
        }
        case ScopeEvent::kClose:
          open[e.unit].reset();
          break;
      }
    }
  }
  engine.finish_backward();
}

}  // namespace

uint64_t EnginePlan::wire_bytes() const {
  uint64_t n = 0;
  for (const auto* m : {&traffic, &node_traffic, &across_traffic}) {
    for (const auto& [op, t] : *m) n += t.wire_bytes;
  }
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
  if (in.tp < 1) ZERO_THROW(InvalidArgument, "plan: tp {} is not positive", in.tp);
  if (in.pp < 1) ZERO_THROW(InvalidArgument, "plan: pp {} is not positive", in.pp);
  auto addressable = [&meta](const void* p, size_t n) { return meta->addressable(p, n); };
  comm::PlanningCommunicator tp_comm(0, in.tp, addressable, meta->kind());
  comm::PlanningCommunicator mp_comm(0, in.tp * in.pp, addressable, meta->kind());
  comm::PlanningCommunicator tied_comm(0, 2, addressable, meta->kind());
  if (in.model_parallel_units > 0) mp_comm.set_peer_int64_max(in.model_parallel_units);
  EngineOptions options = in.options;
  // hpZ's and qgZ's node groups (comm::HybridGroups over the data-parallel group): this rank's node,
  // then its place on every node.
  const bool nodes = options.secondary_shard || options.quantized_gradients.bits != 0;
  if (nodes && options.node_size > 0) {
    const int node = options.node_size;
    comm.plan_splits({{in.rank % node, node}, {in.rank / node, std::max(1, in.world_size / node)}});
  }
  EngineComms comms{&comm, nullptr, meta.get()};
  if (in.tp > 1) comms.model_parallel = &tp_comm;
  if (in.pp > 1) comms.model_parallel = &mp_comm;
  if (in.finalizers) {
    const bool tied = std::any_of(in.model.tensors.begin(), in.model.tensors.end(), [](const TensorSpec& t) { return t.tied; });
    comms.finalizers = in.finalizers(tp_comm, tied ? &tied_comm : nullptr);
  } else if (in.tp > 1) {
    ZERO_THROW(InvalidArgument, "plan: tp {} without PlanInputs.finalizers (parallel::model_parallel_finalizers)", in.tp);
  }
  Engine engine(comms, options);
  // A pipeline stage's micro-batches interleave within one micro-step; without one they are the
  // step's micro-steps.
  const bool interleaved = in.pp > 1;
  if (interleaved) engine.interleave_micro_batches(options.micro_batches);
  std::vector<int> ids;
  for (const TensorSpec& t : in.model.tensors) {
    const size_t numel = shape_numel(t.shape);
    void* data = meta->reserve_unbacked(numel * dtype_size(in.model.dtype_of(t)));
    ids.push_back(engine.add_param({.name = t.name, .shape = t.shape, .dtype = in.model.dtype_of(t), .data = {data, numel},
                                    .unit = t.unit, .group = t.group, .requires_grad = t.trainable, .tp = t.tp,
                                    .tied = t.tied, .param_dtype = t.param_dtype}));
  }
  const std::vector<ScopeEvent> schedule =
      in.model.schedule.empty() ? default_schedule(in.model.tensors) : in.model.schedule;
  engine.finalize();
  const int micro = interleaved ? 1 : options.micro_batches;
  for (int step = 0; step < 2; ++step) {
    if (step == 1) {  // the second step: prefetch order recorded, buffers warm
      comm.reset_tallies();
      tp_comm.reset_tallies();
    }
    for (int m = 0; m < micro; ++m) {
      if (in.step_schedule.empty()) {
        run_micro_step(engine, schedule, ids, interleaved ? options.micro_batches : 1);
      } else {
        run_micro_step(engine, in.step_schedule, ids, 1);
      }
    }
    engine.step();
  }
  EnginePlan plan;
  plan.traffic = comm.tallies();
  if (comm.splits() == 2) {
    plan.node_size = options.node_size;
    plan.node_traffic = comm.split_tallies(0);
    plan.across_traffic = comm.split_tallies(1);
  }
  plan.tp_traffic = tp_comm.tallies();
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
  auto rows = [&](const std::map<std::string, comm::CollectiveTally>& tallies) {
    for (const auto& [op, t] : tallies) {
      s += fmt::format("  {:<16} {:>6} calls {:>12} payload {:>12} sent\n", op, t.calls,
                       memory::format_bytes(t.payload_bytes), memory::format_bytes(t.wire_bytes));
    }
  };
  s += fmt::format("traffic per step (rank {}): {} sent\n", memory.rank, memory::format_bytes(wire_bytes()));
  rows(traffic);
  if (!tp_traffic.empty()) s += "the engine's traffic over the tensor-parallel group per step:\n";
  rows(tp_traffic);
  return s;
}

}  // namespace zero::plan
