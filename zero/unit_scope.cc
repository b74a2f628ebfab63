// UnitScope and NoSyncScope: move-only handles whose end calls back into the engine.
#include <utility>

#include "base/check.h"
#include "zero/engine.h"

namespace zero {

UnitScope::UnitScope(UnitScope&& o) noexcept
    : engine_(std::exchange(o.engine_, nullptr)), unit_(o.unit_), backward_(o.backward_),
      base_(std::exchange(o.base_, nullptr)) {}

UnitScope& UnitScope::operator=(UnitScope&& o) noexcept {
  if (this != &o) {
    end_quietly();
    engine_ = std::exchange(o.engine_, nullptr);
    unit_ = o.unit_;
    backward_ = o.backward_;
    base_ = std::exchange(o.base_, nullptr);
  }
  return *this;
}

UnitScope::~UnitScope() { end_quietly(); }

void UnitScope::end_quietly() noexcept {
  Engine* e = engine_;
  if (e == nullptr) return;
  try {
    close();
  } catch (...) {
    e->note_scope_error(std::current_exception());
  }
}

void UnitScope::close() {
  Engine* e = std::exchange(engine_, nullptr);
  if (e != nullptr) e->end_scope(unit_, backward_);
}

void* UnitScope::param(int id) {
  ZERO_CHECK(engine_ != nullptr, "UnitScope::param() on a closed scope");
  const ParamSpec& p = engine_->registry().param(id);
  if (p.unit != unit_) {
    ZERO_THROW(InvalidArgument, "param({}): parameter '{}' belongs to unit {}, not to this scope's unit {}", id, p.name,
               p.unit, unit_);
  }
  return engine_->scope_param(base_, id);
}

void* UnitScope::grad(int id) {
  ZERO_CHECK(engine_ != nullptr && backward_, "UnitScope::grad() outside an open backward scope");
  const ParamSpec& p = engine_->registry().param(id);
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

}  // namespace zero
