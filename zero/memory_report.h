#pragma once
// Per-rank memory: what the engine measured (memory tracker, plus the registered parameters, which
// the user owns) next to what the ZeRO formulas predict for the configuration:
//
//   stage 0:  (p + g + 4 + k) Ψ                 16Ψ       for 16-bit params/grads and Adam (k = 8)
//   stage 1:  (p + g) Ψ + (4 + k) Ψ / N          4Ψ + 12Ψ/N
//   stage 2:  p Ψ + (a + 4 + k) Ψ / N            2Ψ + 14Ψ/N with a 16-bit gradient shard (a = 2)
//
// p, g: bytes per parameter and gradient element; a: bytes per element of the stage 2 gradient shard
// (EngineOptions::grad_accum_dtype); k: optimizer state bytes per element. Accumulating reduced
// gradients over micro-steps adds an fp32 accumulator (4Ψ at stage 0, 4Ψ/N at stage 1). Bucket
// buffers (in-flight reductions, the parameter all-gather double buffer) are reported separately.
//
// With the optimizer offloaded the master and state terms, (4 + k)Ψ/N (stage 0: (4 + k)Ψ), move to
// the host tier and are compared there on their own; the device keeps the p and g terms (stage 1:
// 4Ψ, stage 2: 2Ψ + 2Ψ/N, stage 3: 4Ψ/N with 16-bit parameters and gradients).
#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "memory/tracker.h"
#include "zero/param_registry.h"

namespace zero {

struct MemoryFormulaInputs {
  int stage = 0;
  int world_size = 1;
  uint64_t numel = 0;          // Ψ: trainable elements
  double param_bytes = 2;      // p (an average where parameters mix dtypes)
  double grad_bytes = 2;       // g
  double shard_grad_bytes = 0;       // a (stage 2) or the accumulator's bytes when one is kept
  bool accumulator = false;    // stages 0/1: an fp32 accumulator for reduced micro-step gradients
  double state_bytes = 8;      // k (an average where groups run different kinds)
  bool offload_optimizer = false;  // master and state in the host tier (OffloadPipeline)
  bool offload_params = false;     // stage 3: the parameter shard in the host tier too
  uint64_t secondary_shard = 0;    // hpZ: the node parts' bytes (outside the formula); 0 without
};

struct MemoryPrediction {
  // On the device (the engine's memory::Device).
  uint64_t params = 0, grads = 0, master = 0, optimizer_state = 0;
  // In the host tier (optimizer offload; the parameter shard with parameter offload).
  uint64_t offload_params = 0, offload_master = 0, offload_state = 0;
  uint64_t total() const { return params + grads + master + optimizer_state; }
  uint64_t offload_total() const { return offload_params + offload_master + offload_state; }
  std::string formula;  // e.g. "2Ψ + 14Ψ/N", or "2Ψ + 2Ψ/N; host 12Ψ/N" with offload
};

MemoryPrediction predict_memory(const MemoryFormulaInputs& in);

// The groups a report's rows add into where one figure per kind of memory is wanted (the planner's
// search, zero_plan's and zero_bench's tables). The report's builder sets each row's, so that every
// reader groups alike; a row of kNone is shown in the report only.
enum class MemoryColumn { kParams, kGrads, kMaster, kOptimizer, kBuffers, kWindow, kHost, kScratch, kNone };
inline constexpr int kNumMemoryColumns = 8;  // all but kNone
const char* memory_column_name(MemoryColumn c);  // "params", "grads", ..., "scratch"

struct MemoryReport {
  struct Row {
    std::string category;
    uint64_t current = 0;
    uint64_t peak = 0;
    uint64_t predicted = 0;
    bool in_formula = true;  // counted in the ZeRO formula (false: bucket buffers and the like; such a
                             // row may still have a prediction of its own, shown when nonzero)
    bool host_tier = false;  // in the offload tier's memory (compared with the formula's host part)
    MemoryColumn column = MemoryColumn::kNone;
  };
  int rank = 0;
  int stage = 0;
  int world_size = 1;
  uint64_t numel = 0;
  std::string formula;
  std::vector<Row> rows;

  uint64_t formula_current() const;   // sum of in-formula device rows
  uint64_t formula_predicted() const;
  double ratio() const;               // formula_current / formula_predicted
  bool offloaded() const;             // some rows are in the host tier
  uint64_t host_current() const;      // sum of in-formula host-tier rows
  uint64_t host_predicted() const;
  double host_ratio() const;
  std::string table() const;
  // Peak bytes per MemoryColumn (kParams first): the sum of the rows' peaks in each.
  std::vector<uint64_t> column_peaks() const;
};

// What an engine knows about its own memory, for build_memory_report. `formula` comes from the stage
// policy (stage, gradient-shard bytes, accumulator); the rest from the engine.
struct EngineMemory {
  const memory::MemoryTracker* tracker = nullptr;  // the engine's own
  const memory::MemoryTracker* offload_tracker = nullptr;  // the host tier's, with optimizer offload
  const ParamRegistry* registry = nullptr;
  int rank = 0;
  MemoryFormulaInputs formula;  // numel and param/grad bytes are filled in by build_memory_report
};

// The engine's tracker by category against predict_memory; the registered parameters (the user's
// storage) as their own row; the communicators' scratch (accounted process-wide) listed apart.
MemoryReport build_memory_report(const EngineMemory& em);

}  // namespace zero
