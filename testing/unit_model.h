#pragma once
// A model for stage 3's gather tests: one fp32 tensor per unit ("unit<u>.w"), and a training step's
// scopes over it (each unit gathered for the forward in order, then for the backward in reverse),
// recording what every scope read. The tests (qwZ, hpZ, qgZ) differ in their options, values and
// gradients, which they pass in.
#include <cstddef>
#include <functional>
#include <vector>

#include "zero/engine.h"

namespace zero::testing {

// What one step's scopes read, per unit (a unit's backward read stays empty without a backward).
struct UnitReads {
  std::vector<std::vector<float>> forward, backward;
};

class UnitModel {
 public:
  // Registers the units with `engine` (not finalized), unit u of sizes[u] elements, element e
  // starting at init(u, e). The storage the engine reads at finalize lives here.
  UnitModel(Engine& engine, std::vector<size_t> sizes, const std::function<float(size_t u, size_t e)>& init);

  size_t units() const { return sizes_.size(); }
  const std::vector<std::vector<float>>& initial() const { return initial_; }
  // Unit u's values as scope s holds them.
  std::vector<float> read(UnitScope& s, size_t u) const;

  // One step's scopes. With `backward`, each backward scope calls backward(u, what it read, the
  // unit's gradient) to add to the gradient; without, the step is forward only. engine.step() is
  // the caller's.
  using Backward = std::function<void(size_t u, const std::vector<float>& read, float* grad)>;
  UnitReads gather_step(const Backward& backward);

 private:
  Engine& engine_;
  std::vector<size_t> sizes_;
  std::vector<std::vector<float>> storage_, initial_;
  std::vector<int> ids_;
};

}  // namespace zero::testing
