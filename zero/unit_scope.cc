// The scopes: Engine's gather / gather_for_backward / no_sync / evaluation, and UnitScope,
// NoSyncScope and EvaluationScope, the move-only handles whose end calls back into the engine.
#include <utility>

#include "base/fault_injection.h"
#include "base/check.h"
#include "zero/engine.h"
#include "zero/engine_impl.h"

namespace zero {

template <typename Scope>
void Engine::close_quietly(Scope& scope) noexcept {
  Engine* e = scope.engine_;
  if (e == nullptr) return;
  try {
    scope.close();
  } catch (...) {
    e->note_scope_error(std::current_exception());
  }
}

UnitScope Engine::gather(int unit) {
  fault::point("forward");
  return open_scope(unit, false, BackwardPart::kAll);
}

UnitScope Engine::gather_for_backward(int unit, BackwardPart part) { return open_scope(unit, true, part); }

UnitScope Engine::open_scope(int unit, bool backward, BackwardPart part) {
  Impl& m = *impl_;
  m.require_unit(unit, backward ? "gather_for_backward" : "gather");
  if (backward && m.evaluating) {
    ZERO_THROW(InvalidArgument, "gather_for_backward({}) inside an evaluation scope: evaluation trains nothing", unit);
  }
  if (backward && m.backward_passes[unit] >= m.micro.passes && part != BackwardPart::kInput) {
    ZERO_THROW(InvalidArgument,
               "gather_for_backward({}): unit {}'s backward already ran {} times in this micro-step ({}); call "
               "finish_backward() or step()",
               unit, unit, m.backward_passes[unit],
               m.micro.interleaved ? fmt::format("the pipeline interleaves EngineOptions.micro_batches = {}", m.micro.passes)
                                   : std::string("micro-batches run one after another, each closed by finish_backward()"));
  }
  if (backward && part != BackwardPart::kAll) {
    auto& [inputs, weights] = m.split_passes[unit];
    if (part == BackwardPart::kWeight && weights >= inputs) {
      ZERO_THROW(InvalidArgument,
                 "gather_for_backward({}, BackwardPart::kWeight): unit {} has no input-gradient scope "
                 "(BackwardPart::kInput) before this weight-gradient scope in this micro-step ({} input, {} weight "
                 "scopes so far): where a schedule splits the backward, its B opens kInput and its W kWeight; a "
                 "whole backward (kAll) in B runs the weights' part twice",
                 unit, unit, inputs, weights);
    }
    ++(part == BackwardPart::kWeight ? weights : inputs);
  }
  if (backward) m.open_micro_step(m.syncs());
  UnitScope scope(this, unit, backward, part, m.evaluating);
  // Micro-batches reduced one by one: the unit's bucket takes its next micro-batch's gradients.
  if (m.writes_grads(scope) && m.each_micro_batch() && m.backward_passes[unit] > 0 && !m.held.unit(unit)) {
    const auto [first, end] = m.unit_buckets.at(unit);
    for (size_t b = first; b < end; ++b) m.parts.reducer->begin_round(b);
  }
  // Below stage 3 (no gatherer) parameters stay in the user's storage; a weight-gradient scope
  // reads none.
  const auto it = m.unit_buckets.find(unit);
  if (m.parts.gatherer && it != m.unit_buckets.end() && m.reads_params(scope)) {
    for (size_t b = it->second.first; b < it->second.second; ++b) {
      void* gathered = m.parts.gatherer->acquire(b, m.use(scope));
      if (b == it->second.first) scope.base_ = gathered;
      if (m.use(scope) == GatherUse::kForward) {
        fault::point("gathered", gathered, m.parts.layout->bucket_bytes(b));
        if (m.records_gathered()) m.record_gathered(b, gathered);
      }
    }
  }
  if (m.writes_grads(scope)) ++m.open_backward[unit];
  return scope;
}

void Engine::end_scope(const UnitScope& scope) {
  Impl& m = *impl_;
  const int unit = scope.unit();
  if (m.writes_grads(scope)) {
    --m.open_backward[unit];
    // The unit's last backward pass of the micro-step (or, reducing each micro-batch, every one):
    // its gradients are complete. Held ones (a finalizer's: the tied copies) wait for
    // finish_backward(), where their finalizer completes them first.
    const bool last = ++m.backward_passes[unit] == m.micro.passes;
    if (last || (m.each_micro_batch() && !m.held.unit(unit))) {
      for (int id : m.registry.params_of_unit(unit)) {
        const int64_t t = m.param_tensor[static_cast<size_t>(id)];
        if (t < 0 || m.held.param(id)) continue;
        if (!m.parts.reducer->is_ready(static_cast<size_t>(t))) m.parts.reducer->tensor_ready(static_cast<size_t>(t));
      }
    }
  }
  const auto it = m.unit_buckets.find(unit);
  if (m.parts.gatherer && it != m.unit_buckets.end() && m.reads_params(scope)) {
    for (size_t b = it->second.first; b < it->second.second; ++b) m.parts.gatherer->release(b, m.use(scope));
  }
}

void* Engine::scope_param(void* base, int id) {
  Impl& m = *impl_;
  const ParamSpec& p = m.registry.param(id);
  const int64_t t = m.param_tensor[static_cast<size_t>(id)];
  if (base == nullptr || t < 0) return p.data.ptr;  // resident: the user's storage
  // The tensor's bucket (one of the unit's when its parameters have several dtypes), gathered.
  const ShardLayout& l = *m.parts.layout;
  const ShardLayout::Tensor& T = l.tensors()[static_cast<size_t>(t)];
  const size_t b = l.buckets_of_tensor(static_cast<size_t>(t)).first;
  return static_cast<char*>(m.parts.gatherer->gathered(b)) + (T.offset - l.buckets()[b].offset) * dtype_size(T.dtype);
}

NoSyncScope Engine::no_sync() {
  Impl& m = *impl_;
  m.require_finalized("no_sync");
  if (m.parts.reducer->micro_step_open() && m.parts.reducer->micro_step_syncs()) {
    ZERO_THROW(InvalidArgument,
               "no_sync() inside a micro-step that already started reducing: open it before the micro-step's first "
               "gradient");
  }
  ++m.no_sync_depth;
  return NoSyncScope(this);
}

bool Engine::evaluating() const { return impl_->evaluating; }

void Engine::end_no_sync() { --impl_->no_sync_depth; }

EvaluationScope Engine::evaluation() {
  Impl& m = *impl_;
  m.require_finalized("evaluation");
  if (m.evaluating) ZERO_THROW(InvalidArgument, "evaluation() inside an evaluation scope");
  for (const auto& [unit, open] : m.open_backward) {
    if (open > 0) ZERO_THROW(InvalidArgument, "evaluation() while the backward scope of unit {} is open", unit);
  }
  if (m.parts.gatherer) m.parts.gatherer->begin_evaluation();
  m.evaluating = true;
  return EvaluationScope(this);
}

void Engine::end_evaluation() {
  Impl& m = *impl_;
  m.evaluating = false;
  if (m.parts.gatherer) m.parts.gatherer->end_evaluation();
}

void Engine::note_scope_error(std::exception_ptr e) {
  if (!impl_->scope_error) impl_->scope_error = std::move(e);
}


UnitScope::UnitScope(UnitScope&& o) noexcept
    : engine_(std::exchange(o.engine_, nullptr)), unit_(o.unit_), backward_(o.backward_), part_(o.part_),
      evaluation_(o.evaluation_), base_(std::exchange(o.base_, nullptr)) {}

UnitScope& UnitScope::operator=(UnitScope&& o) noexcept {
  if (this != &o) {
    Engine::close_quietly(*this);
    engine_ = std::exchange(o.engine_, nullptr);
    unit_ = o.unit_;
    backward_ = o.backward_;
    part_ = o.part_;
    evaluation_ = o.evaluation_;
    base_ = std::exchange(o.base_, nullptr);
  }
  return *this;
}

UnitScope::~UnitScope() { Engine::close_quietly(*this); }

void UnitScope::close() {
  Engine* e = std::exchange(engine_, nullptr);
  if (e != nullptr) e->end_scope(*this);
}

void* UnitScope::param(int id) {
  ZERO_CHECK(engine_ != nullptr, "UnitScope::param() on a closed scope");
  const ParamSpec& p = engine_->registry().param(id);
  if (p.unit != unit_) {
    ZERO_THROW(InvalidArgument, "param({}): parameter '{}' belongs to unit {}, not to this scope's unit {}", id, p.name,
               p.unit, unit_);
  }
  if (backward_ && part_ == BackwardPart::kWeight) {
    ZERO_THROW(InvalidArgument,
               "param({}): parameter '{}' read in a weight-gradient scope of unit {} (BackwardPart::kWeight holds no "
               "parameters: read them in the input-gradient scope)",
               id, p.name, unit_);
  }
  return engine_->scope_param(base_, id);
}

size_t UnitScope::view_numel(int id, ViewType v) const { return engine_->view_numel(id, v); }

size_t Engine::view_numel(int id, ViewType v) const {
  const Impl& m = *impl_;
  const ParamSpec& p = m.registry.param(id);  // names an unknown id
  // Trainable parameters live in the engine in its dtype once finalized; frozen ones stay the user's.
  const bool engine_dtype = m.finalized && m.param_tensor[static_cast<size_t>(id)] >= 0;
  return checked_view_numel(m.registry, id, v, engine_dtype ? m.dtypes.compute(p) : p.dtype);
}

void* UnitScope::grad(int id) {
  ZERO_CHECK(engine_ != nullptr && backward_, "UnitScope::grad() outside an open backward scope");
  const ParamSpec& p = engine_->registry().param(id);
  if (part_ == BackwardPart::kInput) {
    ZERO_THROW(InvalidArgument,
               "grad({}): parameter '{}' written in an input-gradient scope of unit {} (BackwardPart::kInput: the "
               "weight gradients belong to the kWeight scope)",
               id, p.name, unit_);
  }
  if (p.unit != unit_) {
    ZERO_THROW(InvalidArgument, "grad({}): parameter '{}' belongs to unit {}, not to this scope's unit {}", id, p.name,
               p.unit, unit_);
  }
  return engine_->grad(id);
}

NoSyncScope::NoSyncScope(NoSyncScope&& o) noexcept : engine_(std::exchange(o.engine_, nullptr)) {}

NoSyncScope& NoSyncScope::operator=(NoSyncScope&& o) noexcept {
  if (this != &o) {
    if (engine_ != nullptr) engine_->end_no_sync();
    engine_ = std::exchange(o.engine_, nullptr);
  }
  return *this;
}

NoSyncScope::~NoSyncScope() {
  if (engine_ != nullptr) engine_->end_no_sync();
}

EvaluationScope::EvaluationScope(EvaluationScope&& o) noexcept : engine_(std::exchange(o.engine_, nullptr)) {}

EvaluationScope& EvaluationScope::operator=(EvaluationScope&& o) noexcept {
  if (this != &o) {
    Engine::close_quietly(*this);
    engine_ = std::exchange(o.engine_, nullptr);
  }
  return *this;
}

EvaluationScope::~EvaluationScope() { Engine::close_quietly(*this); }

void EvaluationScope::close() {
  Engine* e = std::exchange(engine_, nullptr);
  if (e != nullptr) e->end_evaluation();
}


}  // namespace zero
