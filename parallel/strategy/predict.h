#pragma once
// What a layout costs on a cluster: memory per rank (the engine's categories from its plan on the
// meta device, plus the activations the schedule holds at its peak) and time per step (the stages'
// compute and tensor-parallel collectives, through the pipeline simulator for the bubble; the data-
// parallel collectives the engine's plan counts, less what overlaps the backward; the optimizer).
// Every figure is per rank of the stage that costs most, and comes with its parts (explain()).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "parallel/strategy/cluster.h"
#include "layout/layout.h"
#include "parallel/strategy/model_costs.h"
#include "zero/engine_options.h"

namespace zero::strategy {

struct MemoryParts {
  uint64_t params = 0, grads = 0, master = 0, optimizer = 0, buffers = 0, window = 0, activations = 0;
  uint64_t engine_peak = 0;  // the engine's device peak (all its categories at once)
  uint64_t host = 0;         // the offload tier
  uint64_t device() const { return engine_peak + activations; }
};

struct TimeParts {
  double compute = 0;        // the slowest stage's busy time: F, B, W with their tp collectives
  double tp_comm = 0;        // of which the tp collectives
  double bubble = 0;         // the pipeline's idle time on that stage (the simulator's)
  double dp_comm = 0;        // the engine's collectives per step: data-parallel, and its own tp ones
  double engine_tp = 0;      // of which over the tp group (sp's partial gradients, the norm's sum)
  double dp_exposed = 0;     // the part of them not hidden behind the backward
  double optimizer = 0;      // the update of the rank's shard
  // The waits for the slowest rank at the collectives the compute waits on (Cluster::sync), and how
  // many there are per step: the step's end with dp above 1, each all-gather at ZeRO-3, each tp
  // collective priced from the link (those timed with the kernels hold their waits already).
  double sync = 0;
  double syncs = 0;
  double step() const { return compute + bubble + dp_exposed + sync + optimizer; }
};

// How far the search took a layout.
enum class Estimate {
  kExact,     // planned: its memory and time are the engine's and the model's
  // Not planned: its activations and the parameters the engine keeps alone exceed the device.
  // `memory` is that floor (the activations exact); there is no time.
  kTooLarge,
  // Not planned: its time floor (the pipeline with its tp collectives and bubble, and the optimizer;
  // no dp collectives) is above the step of every layout the search was asked to rank exactly.
  // `time` is that floor, `memory` the floor above; whether it fits is not known.
  kTooSlow,
  // Not planned: the time limit (PlanSettings::time_limit) ended the search first. `time` and
  // `memory` are floors as for kTooSlow, but the layout might have ranked first.
  kNotPlanned,
  // Not examined: the time limit ended the search before its floors were made. No figures.
  kNotExamined,
};

struct Prediction {
  Layout layout;
  std::string unsupported;  // why the model cannot run it ("" when it can)
  MemoryParts memory;       // of the pipeline rank with the largest device memory
  int memory_stage = 0;     // that rank
  uint64_t largest_activations = 0;  // the largest activation peak of any pipeline rank
  bool fits = false;
  Estimate estimate = Estimate::kExact;
  TimeParts time;
  double bubble_fraction = 0;
  double tokens_per_s = 0;
  // What rank_layouts pruned with (0 from predict): the floors of the device memory and of the step,
  // never above the exact figures (predict_test holds them).
  uint64_t memory_floor = 0;
  double time_floor = 0;
  // The ZeRO++ parts priced in, where rank_layouts_with_zeropp chose some ("qwZ int8 + hpZ"); "":
  // the settings' own options.
  std::string zeropp;
};

// Where a search (rank_layouts) stands: layouts examined (their floors computed) of all given, then
// those planned exactly; the fastest floor of a layout whose floors fit so far (a lower bound on the
// answer's step), and the fastest planned layout that fits.
struct SearchProgress {
  size_t examined = 0, layouts = 0, planned = 0, fitting_floors = 0;
  double fastest_floor = 0;  // seconds; 0: none yet
  std::optional<Layout> best;
  double best_step = 0;  // seconds, of `best`
  bool done = false;     // the last call, as the search ends
};

struct PlanSettings {
  EngineOptions engine;  // optimizer, groups, dtypes: the stage, offload and micro-batches are set per layout
  int global_batch = 1;  // sequences per step
  // Called by rank_layouts about every `progress_seconds` while it searches, and once at its end
  // (zero_plan prints a line each time); empty: not called.
  std::function<void(const SearchProgress&)> progress;
  double progress_seconds = 5.0;
  // rank_layouts' threads: the model's stage() and unsupported() are called from this many at once
  // (DescribedModel allows it; a model of one's own must, or keep 1).
  int threads = 1;
  // Seconds after which rank_layouts stops examining and planning and ranks what it has (the rest
  // are Estimate::kNotExamined and kNotPlanned); 0: no limit.
  double time_limit = 0;
};

Prediction predict(const ModelCosts& model, const Layout& layout, const Cluster& cluster, const PlanSettings& settings);

// The engine's options of a planned layout: zero::engine_options(layout, base), with stage 3's own
// features (ZeRO++'s quantized gathers, secondary shards and quantized reduction) off for a layout
// below stage 3, so that a search given them prices them where they apply and runs the rest
// without. Where hpZ or qgZ is on and base.node_size is not given, the node holds
// devices_per_node / tp of the layout's data-parallel ranks (as many as divide dp).
EngineOptions planned_options(const Layout& layout, const EngineOptions& base, int devices_per_node);

// The micro-batch counts the search tries for a replica of `global_batch` / dp sequences: for each
// of pp, 2 pp, 4 pp, ... up to that batch, the smallest count at or above it dividing the batch and
// the smallest such multiple of pp (ascending, no repeats; none where dp does not divide the batch).
std::vector<int> micro_batch_counts(int global_batch, int dp, int pp);

// Every layout of `world` ranks the model supports: dp x tp x pp, ZeRO stages 0-3, the micro-batch
// counts above, the schedules (GPipe,
// 1F1B, ZB-H1, ZB-V, interleaved 1F1B at 2, 4, ... 16 chunks per rank),
// sequence parallelism at tp above 1, offload at stages 1-3, and activation recompute.
std::vector<Layout> enumerate_layouts(const ModelCosts& model, int world, int global_batch);

// Predictions for every layout: those that fit first, fastest first; then those too slow to rank,
// by their time floor; then the rest, smallest first. A layout whose activations and kept
// parameters alone exceed the device is not planned (Estimate::kTooLarge) unless no layout fits,
// when the smallest are planned until the smallest of all is known exactly. The others are planned
// in the order of their time floors until `exact` fitting layouts are known and no floor is below
// the slowest of them (the rest: Estimate::kTooSlow): the first `exact` are the same as planning
// everything would rank first. Layouts that differ only in schedule or recompute share their
// engine plans. The answer does not depend on settings.threads; with settings.time_limit it is the
// best of what was planned in time, and reason() says what was not.
std::vector<Prediction> rank_layouts(const ModelCosts& model, const std::vector<Layout>& layouts, const Cluster& cluster,
                                     const PlanSettings& settings, size_t exact = SIZE_MAX);

// rank_layouts, with ZeRO++ chosen where it pays: each stage 3 layout is also priced with ZeRO++'s
// published combinations (qwZ int8; qwZ int8 + hpZ; qwZ int8 + hpZ + qgZ int4, the nodes from the
// cluster) and keeps its fastest variant that fits (Prediction::zeropp names it). Quantization
// changes the numerics (docs/zero.md has the parity): a caller asks for it.
// `base` with the ZeRO++ variant a Prediction names (Prediction::zeropp; "" leaves it as it is).
EngineOptions zeropp_options(const EngineOptions& base, const std::string& zeropp);
std::vector<Prediction> rank_layouts_with_zeropp(const ModelCosts& model, const std::vector<Layout>& layouts,
                                                 const Cluster& cluster, const PlanSettings& settings, size_t exact);

// The table (layout, memory per rank by category, step time, tokens/s, bubble, exposed dp
// communication); the one line on why the first is chosen; one prediction's breakdown.
std::string table(const std::vector<Prediction>& ranked, size_t limit);
std::string reason(const std::vector<Prediction>& ranked);
std::string explain(const Prediction& p);

}  // namespace zero::strategy
