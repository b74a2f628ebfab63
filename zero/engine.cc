// The engine's public front: micro-step bookkeeping and argument checks over the parts that the
// stage policy wires at finalize() (zero/stage_policy.h).
#include "zero/engine.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "base/env.h"
#include "base/fault_injection.h"
#include "optim/custom_optimizer.h"
#include "zero/engine_groups.h"
#include "zero/engine_impl.h"

namespace zero {

namespace {

// The engine's own host device. ZERO_HOST_THREADED_STREAMS=1 is a test knob, read once, as
// ZERO_COMM_CHECK is: it runs the device's copy and reduce streams on worker threads
// (HostDeviceOptions::threaded_streams), so that under ThreadSanitizer a missing event wait is a
// reported race in every test of the suite, not only in the tests that ask for that mode.
memory::HostDeviceOptions own_device_options() {
  static const bool threaded = env_bool("ZERO_HOST_THREADED_STREAMS", false);
  return {.threaded_streams = threaded};
}

}  // namespace

Engine::Engine(comm::Communicator& comm, EngineOptions options) : Engine(EngineComms{&comm}, std::move(options)) {}

Engine::Engine(const EngineComms& comms, EngineOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (comms.shard == nullptr) ZERO_THROW(InvalidArgument, "EngineComms.shard is null");
  validate(options);
  check_topology(options, comms.replica != nullptr);
  m.micro = micro_batching(options, false);
  if (comms.layout) check_layout(options, *comms.layout);
  m.comms = comms;
  m.options = std::move(options);
  m.device = comms.device;
  if (m.device == nullptr) {
    m.own_tracker = std::make_unique<memory::MemoryTracker>();
    m.own_device = memory::make_host_device(*m.own_tracker, own_device_options());
    m.device = m.own_device.get();
  }
  // The pairing is checked now, not at the first collective.
  bind_groups(comms, *m.device, m.options.timeout);
  if (m.options.loss_scaling == LossScaling::kDynamic) m.scaler.emplace(m.options.dynamic_loss_scaler);
}

Engine::~Engine() = default;

int Engine::add_param(const ParamSpec& spec) {
  if (impl_->finalized) {
    ZERO_THROW(InvalidArgument, "add_param('{}') after finalize(): register every parameter first", spec.name);
  }
  // A group's name patterns (optimizer.groups[].params) place the parameter, over its own group.
  ParamSpec placed = spec;
  placed.group = optim::group_by_name(impl_->options.optimizer, spec.name).value_or(spec.group);
  return impl_->registry.add(placed);
}

void Engine::interleave_micro_batches(int micro_batches) {
  Impl& m = *impl_;
  if (m.finalized) ZERO_THROW(InvalidArgument, "interleave_micro_batches({}) after finalize()", micro_batches);
  EngineOptions o = m.options;
  o.micro_batches = micro_batches;
  validate(o);
  m.micro = micro_batching(o, true);
  m.options.micro_batches = micro_batches;
}

void Engine::finalize() {
  Impl& m = *impl_;
  if (m.finalized) ZERO_THROW(InvalidArgument, "finalize() called twice");
  // Problems that need the options are recorded as local errors, so verification reports them on
  // every rank instead of leaving the others waiting in a collective.
  const std::optional<ModelDtypes> dtypes = check_registration(m.options, m.registry);
  check_claimed(m.comms.finalizers, m.registry);
  check_whole_tensor_rule(m.options, m.comms.finalizers, m.registry);
  for (const auto& f : m.comms.finalizers) f->check(m.registry);
  check_groups_agree(m.comms, m.registry, fingerprint(m.options), *m.device, m.options.timeout);
  m.dtypes = *dtypes;
  m.tensor_param = layout_tensor_order(m.registry, m.dtypes);
  m.param_tensor.assign(m.registry.params().size(), -1);
  for (size_t t = 0; t < m.tensor_param.size(); ++t) m.param_tensor[static_cast<size_t>(m.tensor_param[t])] = static_cast<int64_t>(t);
  broadcast_initial_values(m.comms, m.registry, *m.device, m.options.timeout);
  for (const auto& f : m.comms.finalizers) f->initial_values(m.registry);
  m.parts = wire_stage({&m.options, m.micro, &m.registry, m.tensor_param, m.dtypes, m.comms.shard, m.comms.replica,
                        m.device, &m.timings, m.comms.model_parallel, m.comms.finalizers});
  m.held = HeldGrads(m.comms.finalizers, m.registry, m.tensor_param);
  for (size_t b = 0; b < m.parts.layout->buckets().size(); ++b) {
    const int unit = m.parts.layout->buckets()[b].unit;
    if (unit < 0) continue;
    auto [it, first] = m.unit_buckets.try_emplace(unit, b, b + 1);
    if (!first) it->second.second = b + 1;
  }
  m.finalized = true;
}

bool Engine::finalized() const { return impl_->finalized; }

bool Engine::params_resident() const {
  if (!impl_->finalized) ZERO_THROW(InvalidArgument, "params_resident() called before finalize()");
  return impl_->parts.gatherer == nullptr;
}

void* Engine::grad(int id) {
  Impl& m = *impl_;
  const size_t t = m.tensor_of(id, "grad");
  const ParamSpec& p = m.registry.param(id);
  return p.grad.ptr != nullptr ? p.grad.ptr : m.parts.reducer->grad(t);
}

void Engine::grad_ready(int id) {
  const size_t t = impl_->tensor_of(id, "grad_ready");
  if (impl_->held.param(id)) return;  // completed by finish_backward(), by its finalizer
  impl_->parts.reducer->tensor_ready(t);
}

void Engine::finish_backward() {
  Impl& m = *impl_;
  m.require_finalized("finish_backward");
  if (m.micro_steps >= m.micro.micro_steps) {
    ZERO_THROW(InvalidArgument,
               "finish_backward(): {} micro-batches since the last step() but EngineOptions.micro_batches is {}{}; "
               "call step()",
               m.micro_steps + 1, m.options.micro_batches,
               m.micro.interleaved ? " (interleaved by a pipeline: one finish_backward() per step)" : "");
  }
  if (m.micro.passes > 1) {
    for (const auto& [unit, passes] : m.backward_passes) {
      if (passes > 0 && passes < m.micro.passes) {
        ZERO_THROW(InvalidArgument,
                   "finish_backward(): unit {}'s backward ran {} times in this micro-step but the pipeline interleaves "
                   "EngineOptions.micro_batches = {}",
                   unit, passes, m.micro.passes);
      }
    }
  }
  m.open_micro_step(m.syncs());
  m.held.complete(*m.parts.reducer, m.registry, m.dtypes);
  m.parts.reducer->end_micro_step();
  m.clear_passes();
  ++m.micro_steps;
}

StepResult Engine::step() {
  Impl& m = *impl_;
  m.require_finalized("step");
  if (m.evaluating) ZERO_THROW(InvalidArgument, "step() inside an evaluation scope: close it first");
  if (m.parts.reducer->micro_step_open() || m.micro_steps == 0) finish_backward();
  if (m.parts.reducer->holds_unreduced()) {
    // Fewer micro-steps than configured, or the last one inside no_sync: reduce what accumulated.
    m.open_micro_step(true);
    m.parts.reducer->end_micro_step();
  }
  // The mean over ranks, micro-steps and micro-batches.
  const double divisor = static_cast<double>(m.world()) * m.micro_steps * m.micro.passes;
  // Stage 3's shard against the checksum it carried since the step before, before this update
  // rewrites it (the check of the step that takes the engine to a multiple of replica_check_every).
  const int every = m.replica_check_interval();
  if (every > 0 && m.shard_checksums_recorded && (m.steps_taken + 1) % every == 0) {
    m.verify_shard_at_rest(m.steps_taken + 1, rank());
  }
  StepResult r;
  try {
    ScopedTimer updating(&m.timings.optimizer_s);
    r = m.parts.update->step(*m.parts.reducer, loss_scale(), divisor, m.scaler ? &*m.scaler : nullptr, m.steps_taken);
  } catch (...) {
    m.parts.reducer->clear();
    m.clear_passes();
    m.micro_steps = 0;
    throw;
  }
  r.micro_steps = m.micro_steps;
  // The step's end, past its one host wait: the ranks compare the calls each group issued (a
  // backend that checks every call as it is issued has nothing to do; NCCL compares here).
  verify_group_schedules(m.comms);
  // Before the next step's prefetch reads the shard (after_step below).
  if (every > 0 && r.step > m.steps_taken && r.step % every == 0) m.check_replicas(r.step, rank());
  if (every > 0 && m.parts.gatherer && (r.step + 1) % every == 0) m.record_shard_at_rest();
  if (m.parts.gatherer) {
    fault::point("shard_at_rest", m.parts.gatherer->shard(), m.parts.layout->shard_bytes());
    m.parts.gatherer->after_step();
  }
  m.parts.reducer->clear();
  m.micro_steps = 0;
  m.steps_taken = r.step;
  m.last_timings = std::exchange(m.timings, StepTimings{});
  return r;
}

void Engine::zero_grad() {
  Impl& m = *impl_;
  m.require_finalized("zero_grad");
  if (m.parts.reducer->micro_step_open()) {
    m.parts.reducer->begin_micro_step(false);  // finish without reducing what is being dropped
    m.parts.reducer->end_micro_step();
  }
  m.parts.reducer->clear();
  m.clear_passes();
  m.micro_steps = 0;
}

float Engine::loss_scale() const {
  switch (impl_->options.loss_scaling) {
    case LossScaling::kNone: return 1.0f;
    case LossScaling::kStatic: return impl_->options.static_loss_scale;
    case LossScaling::kDynamic: return impl_->scaler->scale();
  }
  return 1.0f;
}

optim::Optimizer& Engine::optimizer() {
  impl_->require_finalized("optimizer");
  optim::Optimizer* o = impl_->parts.update->optimizer().host_optimizer();
  if (o == nullptr && impl_->options.optimizer.custom) {
    ZERO_THROW(InvalidArgument, "optimizer(): the engine runs the custom optimizer '{}' (EngineOptions.optimizer.custom)",
               impl_->options.optimizer.custom->name());
  }
  if (o == nullptr) ZERO_THROW(InvalidArgument, "optimizer(): the engine's optimizer runs on {}, not the CPU", impl_->device->name());
  return *o;
}

optim::Hyper& Engine::param_group(int group) {
  impl_->require_finalized("param_group");
  return impl_->parts.update->optimizer().group(group);
}

const ParamRegistry& Engine::registry() const { return impl_->registry; }
const EngineOptions& Engine::options() const { return impl_->options; }
const EngineComms& Engine::comms() const { return impl_->comms; }
memory::Device& Engine::device() { return *impl_->device; }
int64_t Engine::steps_taken() const { return impl_->steps_taken; }
const StepTimings& Engine::step_timings() const { return impl_->last_timings; }
int Engine::world_size() const { return impl_->world(); }

int Engine::rank() const {
  const EngineComms& c = impl_->comms;
  return (c.replica ? c.replica->rank() * c.shard->size() : 0) + c.shard->rank();
}

MemoryReport Engine::memory_report() const {
  const Impl& m = *impl_;
  if (!m.finalized) ZERO_THROW(InvalidArgument, "memory_report() called before finalize()");
  EngineMemory em;
  em.tracker = &m.device->tracker();
  em.offload_tracker = m.parts.offload_tracker.get();
  em.registry = &m.registry;
  em.rank = rank();
  em.formula = m.parts.formula;
  return build_memory_report(em);
}

}  // namespace zero
