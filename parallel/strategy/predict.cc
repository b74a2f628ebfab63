#include "parallel/strategy/predict.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <numeric>
#include <memory>
#include <mutex>
#include <numeric>
#include <queue>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "memory/tracker.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/held_activations.h"
#include "parallel/pipeline/pipeline_check.h"
#include "parallel/pipeline/schedule_sim.h"
#include "parallel/pipeline/schedules.h"
#include "zero/param_registry.h"
#include "zero/plan/engine_plan.h"
#include "zero/stage_policy.h"

namespace zero::strategy {
namespace {

// A group of `span` consecutive ranks (tp fastest, then dp, then pp: the mesh's default order) lies
// inside a node when the node holds them all.
const Link& link_for(const Cluster& c, int span) { return span <= c.devices_per_node ? c.intra : c.inter; }

// More ranks than devices on a machine whose ranks share its cores: each runs that much slower.
double shared_core_slowdown(const Layout& l, const Cluster& cluster) {
  return cluster.shared_cores ? std::max(1.0, static_cast<double>(l.world()) / cluster.devices()) : 1.0;
}

// Ring collectives over n ranks: an all-reduce sends 2 (n-1)/n of the buffer in 2 (n-1) messages,
// an all-gather or a reduce-scatter (n-1)/n in n-1.
double collective_time(TpCollective::Kind kind, double bytes, int n, const Link& link) {
  if (n <= 1) return 0.0;
  const double share = (n - 1.0) / n, hops = n - 1.0;
  return kind == TpCollective::kAllReduce ? 2 * (share * bytes / link.bandwidth + hops * link.latency)
                                          : share * bytes / link.bandwidth + hops * link.latency;
}

double tp_time(const std::vector<TpCollective>& cs, int tp, const Link& link) {
  double t = 0;
  for (const TpCollective& c : cs) t += collective_time(c.kind, c.bytes, tp, link);
  return t;
}

// The engine's collectives of one step over a group of n ranks, from its plan's tallies (wire bytes
// per rank; each call's messages). Over one rank nothing crosses a link, but each all-gather or
// reduce-scatter still copies its payload into its output (ZeRO-3 filling its window, say): the
// cluster's `copy` per call (absent: free).
double engine_collectives_time(const std::map<std::string, comm::CollectiveTally>& tallies, int n, const Link& link,
                               const std::optional<Link>& copy) {
  double t = 0;
  for (const auto& [op, tally] : tallies) {
    if (n <= 1) {
      if (copy && op != "all_reduce") {
        t += static_cast<double>(tally.calls) * copy->latency + static_cast<double>(tally.payload_bytes) / copy->bandwidth;
      }
      continue;
    }
    const double messages = (op == "all_reduce" ? 2.0 : 1.0) * (n - 1.0) * static_cast<double>(tally.calls);
    t += static_cast<double>(tally.wire_bytes) / link.bandwidth + messages * link.latency;
  }
  return t;
}

MemoryParts memory_of(const plan::EnginePlan& p, int stage) {
  const std::vector<uint64_t> c = p.memory.column_peaks();
  auto at = [&](MemoryColumn column) { return c[static_cast<size_t>(column)]; };
  MemoryParts m;
  m.params = at(MemoryColumn::kParams);
  m.grads = at(MemoryColumn::kGrads);
  m.master = at(MemoryColumn::kMaster);
  m.optimizer = at(MemoryColumn::kOptimizer);
  m.buffers = at(MemoryColumn::kBuffers);
  m.window = at(MemoryColumn::kWindow);
  m.host = at(MemoryColumn::kHost);
  // Below stage 3 the parameters are the model's own storage, outside the engine's tracker.
  m.engine_peak = p.device_peak + (stage < 3 ? m.params : 0);
  return m;
}

// The costs of rank `rank`'s chunk `chunk` (its virtual stage in the layout's schedule's placement).
const StageCosts& chunk_costs(const Layout& l, const std::vector<StageCosts>& stages, int rank, int chunk) {
  const parallel::Schedule shape{.placement = parallel::placement_of(l.schedule), .ranks = l.pp, .chunks = l.chunks};
  return stages[static_cast<size_t>(shape.virtual_stage(rank, chunk))];
}

// What each virtual stage's micro-batch holds (parallel/pipeline/held_activations.h).
parallel::HeldBytes held_bytes(const std::vector<StageCosts>& stages) {
  parallel::HeldBytes h;
  h.forward.clear();
  h.weight.clear();
  h.rebuilt.clear();
  h.input_peak.clear();
  for (const StageCosts& c : stages) {
    h.forward.push_back(static_cast<double>(c.activation_bytes));
    h.weight.push_back(static_cast<double>(c.weight_bytes));
    h.rebuilt.push_back(static_cast<double>(c.rebuilt_bytes));
    h.input_peak.push_back(static_cast<double>(c.input_peak_bytes));
  }
  return h;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

// The engine's plans on the meta device by what they depend on: a layout's schedule and recompute
// change neither the engine's tensors (ModelCosts' contract) nor its options, so those share one
// (with several chunks per rank the scopes' order is the interleaved schedule's, which the chunks
// and micro-batches determine).
// Shared by a search's threads: a plan being made by one is waited for by another that needs it.
class PlanCache {
 public:
  const plan::EnginePlan& get(const std::string& key, const std::function<plan::EnginePlan()>& make) {
    std::promise<plan::EnginePlan> made;
    std::shared_future<plan::EnginePlan> plan;
    bool mine = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = plans_.find(key);
      if (it == plans_.end()) {
        it = plans_.emplace(key, made.get_future().share()).first;
        mine = true;
      }
      plan = it->second;
    }
    if (mine) {
      try {
        made.set_value(make());
      } catch (...) {
        made.set_exception(std::current_exception());
      }
    }
    return plan.get();  // the map's future holds the value as long as the cache lives
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::shared_future<plan::EnginePlan>> plans_;
};

// The layouts' schedules, each kind checked (check_schedule) the first time it is made: a search
// simulates one schedule under the costs of thousands of layouts, and checking it every time took a
// third of the search. Only which kinds were checked is kept (at many ranks and micro-batches the
// action lists themselves would be gigabytes).
class Schedules {
 public:
  // ZB-H1 from the stages' activation sizes (its memory bound is in bytes) and unit times, as a run
  // generates it (train_gpt, gpt_schedule), so that the plan is of the schedule that runs.
  parallel::Schedule of(const Layout& l, const std::vector<StageCosts>& stages) {
    // pp 1: one micro-batch at a time.
    const std::string name = l.pp > 1 ? l.schedule : "1f1b";
    parallel::ActionCosts costs;
    costs.held = held_bytes(stages);
    parallel::Schedule s = parallel::make_schedule(name, l.pp, l.micro_batches, l.chunks, 0, costs);
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);  // a search's threads share it
      first = checked_.insert({name, l.pp, l.micro_batches, l.chunks}).second;
    }
    if (first) parallel::check_schedule(s);
    return s;
  }

 private:
  std::mutex mutex_;
  std::set<std::tuple<std::string, int, int, int>> checked_;
};

std::vector<StageCosts> stage_costs(const ModelCosts& model, const Layout& l, const Cluster& cluster,
                                    const PlanSettings& settings) {
  std::vector<StageCosts> out;
  for (int s = 0; s < l.virtual_stages(); ++s) out.push_back(model.stage(l, s, settings.global_batch, cluster));
  return out;
}

// The trainable elements pipeline rank `rank` holds over its chunks, and their bytes in their dtypes.
struct RankTensors {
  uint64_t numel = 0, bytes = 0;
  uint64_t narrow_numel = 0;  // of them, in a dtype narrower than fp32 (an fp32 master each)
  // Gathered at 16 bits at most (a narrower param_dtype than the tensor's may gather it so): the
  // largest of the rank's units (ZeRO-3 gathers one whole to compute it), and all of them.
  uint64_t largest_unit_bytes = 0, gathered_bytes = 0;
};
RankTensors rank_tensors(const Layout& l, const std::vector<StageCosts>& stages, int rank) {
  RankTensors n;
  std::set<std::string> tied;  // a tied weight both of whose uses the rank holds (a V's rank 0) counts once
  for (int c = 0; c < l.chunks; ++c) {
    const plan::ModelSpec& spec = *chunk_costs(l, stages, rank, c).engine;
    std::map<int, uint64_t> unit_bytes;
    for (const plan::TensorSpec& t : spec.tensors) {
      if (!t.trainable || (t.tied && !tied.insert(t.name).second)) continue;
      const uint64_t numel = shape_numel(t.shape), size = dtype_size(t.dtype.value_or(spec.dtype));
      n.numel += numel;
      n.bytes += numel * size;
      if (size < 4) n.narrow_numel += numel;
      const uint64_t gathered = numel * std::min<uint64_t>(size, 2);
      n.gathered_bytes += gathered;
      n.largest_unit_bytes = std::max(n.largest_unit_bytes, unit_bytes[t.unit] += gathered);
    }
  }
  return n;
}
// Every pipeline rank's: what the memory floor and the optimizer's time read (the same for the
// layouts that differ only in ZeRO stage and offload, so a search computes them once for those).
std::vector<RankTensors> ranks_tensors(const Layout& l, const std::vector<StageCosts>& stages) {
  std::vector<RankTensors> out;
  for (int r = 0; r < l.pp; ++r) out.push_back(rank_tensors(l, stages, r));
  return out;
}

// Bytes per element the optimizer's state surely takes: AdamW's and Adam's two moments in the
// state dtype where every group runs one of them; else none (8-bit, factored, a user's rule: the
// plan says).
double least_state_bytes(const EngineOptions& o) {
  const optim::OptimizerOptions& opt = o.optimizer;
  if (opt.custom) return 0;
  for (const optim::Hyper& h : opt.groups) {
    const optim::OptimizerKind k = h.kind.value_or(opt.kind);
    if (k != optim::OptimizerKind::kAdamW && k != optim::OptimizerKind::kAdam) return 0;
  }
  return 2.0 * static_cast<double>(dtype_size(opt.state_dtype));
}

// The least device memory any pipeline rank of the layout needs, without planning its engine: the
// activations at the schedule's peak and what the engine must keep of the rank's tensors whatever
// its buffers: the parameters (a 1/dp share at ZeRO-3, where it also gathers at least its largest
// unit whole to compute it), their gradients in their dtypes (a 1/dp share from ZeRO-2), and,
// unless offloaded, the fp32 master of parameters narrower than fp32 and AdamW's moments (a 1/dp
// share from ZeRO-1). The gradient shard's own dtype, other optimizers' state and the buffers are
// left to the plan, and every share is rounded down where the engine pads up, so this never
// exceeds the plan (predict_test holds the two). Also the largest activation peak of any rank.
// `peaks`: each rank's (PipelineTime::activations); `ranks`: ranks_tensors.
struct MemoryFloor {
  uint64_t device = 0, activations = 0;
};
MemoryFloor memory_floor(const Layout& l, const std::vector<RankTensors>& ranks, const std::vector<uint64_t>& peaks,
                         const EngineOptions& base) {
  MemoryFloor floor;
  const auto dp = static_cast<uint64_t>(l.dp);
  const EngineOptions options = planned_options(l, base, 0);
  const double state = least_state_bytes(options);
  // A pipeline's micro-batches interleave: at ZeRO-3 its units stay gathered through the step
  // (unless a window limit is set) and from ZeRO-2 each unit's gradient accumulates whole until
  // its last micro-batch (unless reduced at each), so at the last micro-batch's backward the rank
  // holds both whole.
  const MicroBatching mb = micro_batching(options, l.pp > 1);
  const bool whole_window = mb.keep_gathered && options.max_live_gathered_bytes == 0;
  const bool whole_grads = l.pp > 1 && l.stage >= 2 && l.micro_batches > 1 && !mb.reduce_each_pass;
  for (int r = 0; r < l.pp; ++r) {
    const RankTensors& t = ranks[static_cast<size_t>(r)];
    const uint64_t window = l.stage < 3 || dp == 1 ? 0 : whole_window ? t.gathered_bytes : t.largest_unit_bytes;
    const uint64_t params = (l.stage == 3 ? t.bytes / dp : t.bytes) + window;
    const uint64_t grads = (l.stage >= 2 ? t.bytes / dp : t.bytes) + (whole_grads ? t.bytes : 0);
    const uint64_t sharded = l.stage >= 1 ? dp : 1;
    const uint64_t optimizer =
        l.offload_optimizer ? 0 : 4 * t.narrow_numel / sharded + static_cast<uint64_t>(state * t.numel) / sharded;
    const uint64_t activations = peaks[static_cast<size_t>(r)];
    floor.device = std::max(floor.device, activations + params + grads + optimizer);
    floor.activations = std::max(floor.activations, activations);
  }
  return floor;
}

// The engine's model on pipeline rank `rank`: its chunks' tensors in chunk order (as the loop
// registers them); with several chunks, the step's scopes in the schedule's order (each forward
// action its chunk's forward scopes, each backward its backward scopes), since the chunks'
// micro-batches interleave.
struct RankModel {
  plan::ModelSpec spec;
  std::vector<plan::ScopeEvent> step;
};
RankModel rank_model(const Layout& l, const std::vector<StageCosts>& stages, const parallel::Schedule& schedule,
                     int rank) {
  RankModel m{*chunk_costs(l, stages, rank, 0).engine, {}};
  if (l.chunks == 1) return m;
  // Each chunk's scope events of one micro-batch, split where its backward begins, the gradients'
  // tensor indices moved to the merged list.
  std::vector<std::vector<plan::ScopeEvent>> forward(static_cast<size_t>(l.chunks)), backward = forward;
  m.spec.tensors.clear();
  m.spec.schedule.clear();
  // A rank that holds the first and the last virtual stage (a V's rank 0) holds a tied weight once:
  // the last chunk reads the first's, untied, and adds its gradient there (examples/gpt's
  // GptTieOnRank), so its copy and its gradient events go, and its backward scopes of that unit
  // only read (gathers that complete no gradient: replayed as forward ones).
  const bool tie_on_rank = schedule.virtual_stage(rank, 0) == 0 &&
                           schedule.rank_of(schedule.virtual_stages() - 1) == rank && l.chunks > 1;
  std::map<std::string, size_t> tied_first;  // name -> index in the merged list
  for (int c = 0; c < l.chunks; ++c) {
    const plan::ModelSpec& chunk = *chunk_costs(l, stages, rank, c).engine;
    std::vector<int64_t> index(chunk.tensors.size(), -1);  // into the merged list (-1: the first's copy)
    std::set<int> borrowed;                                 // units whose tensors are the first's
    for (size_t t = 0; t < chunk.tensors.size(); ++t) {
      plan::TensorSpec spec = chunk.tensors[t];
      if (tie_on_rank && spec.tied) {
        if (c > 0 && tied_first.count(spec.name)) {
          borrowed.insert(spec.unit);
          continue;
        }
        tied_first[spec.name] = m.spec.tensors.size();
        spec.tied = false;
      }
      index[t] = static_cast<int64_t>(m.spec.tensors.size());
      m.spec.tensors.push_back(std::move(spec));
    }
    for (plan::ScopeEvent e : chunk.schedule.empty() ? plan::default_schedule(chunk.tensors) : chunk.schedule) {
      if (e.kind == plan::ScopeEvent::kGrad) {
        if (index[e.tensor] < 0) continue;
        e.tensor = static_cast<size_t>(index[e.tensor]);
      } else if (e.backward && borrowed.count(e.unit)) {
        e.backward = false;  // a gather that reads, in the backward action
        backward[static_cast<size_t>(c)].push_back(e);
        continue;
      }
      (e.backward ? backward : forward)[static_cast<size_t>(c)].push_back(e);
    }
  }
  for (const parallel::Action& a : schedule.actions[static_cast<size_t>(rank)]) {
    const std::vector<plan::ScopeEvent>* events = a.op == parallel::Op::kF                              ? &forward[a.chunk]
                                                  : a.op == parallel::Op::kBW || a.op == parallel::Op::kB ? &backward[a.chunk]
                                                                                                          : nullptr;
    if (events != nullptr) m.step.insert(m.step.end(), events->begin(), events->end());
  }
  return m;
}

}  // namespace

namespace {

// What a rank's engine plan depends on besides the layout, as two 64-bit hashes: its tensors' shapes,
// dtypes, placements, groups and flags with their units counted from the rank's first, and its
// step's scope events. Pipeline ranks that hold the same layers (the middle ones of a deep
// pipeline) share a plan; names, which differ, do not matter to the engine.
std::pair<uint64_t, uint64_t> model_signature(const RankModel& m) {
  uint64_t a = 1469598103934665603ull, b = 1099511628211ull;
  auto mix = [&](uint64_t x) {
    a = (a ^ x) * 1099511628211ull;
    b = (b + x) * 0x9E3779B97F4A7C15ull;
    b ^= b >> 29;
  };
  int first = INT32_MAX;
  for (const plan::TensorSpec& t : m.spec.tensors) first = std::min(first, t.unit);
  mix(static_cast<uint64_t>(m.spec.dtype));
  for (const plan::TensorSpec& t : m.spec.tensors) {
    mix(t.shape.size());
    for (int64_t d : t.shape) mix(static_cast<uint64_t>(d));
    mix(static_cast<uint64_t>(t.unit - first));
    mix((t.trainable ? 1u : 0u) | (t.tied ? 2u : 0u) | (static_cast<uint64_t>(t.group) << 2));
    mix(static_cast<uint64_t>(t.tp.kind) | (t.tp.partial_grad ? 2u : 0u) | static_cast<uint64_t>(t.tp.dim + 1) << 2 |
        static_cast<uint64_t>(t.tp.blocks) << 12);
    mix(t.dtype ? static_cast<uint64_t>(*t.dtype) + 1 : 0);
    mix(t.param_dtype ? static_cast<uint64_t>(*t.param_dtype) + 1 : 0);
  }
  mix(m.spec.schedule.size());
  mix(m.step.size());
  for (const auto* events : {&m.spec.schedule, &m.step}) {
    for (const plan::ScopeEvent& e : *events) {
      mix(static_cast<uint64_t>(e.kind) | (e.backward ? 4u : 0u) | static_cast<uint64_t>(e.unit - first) << 3);
      mix(e.tensor);
    }
  }
  return {a, b};
}

const plan::EnginePlan& engine_plan(const Layout& l, const std::vector<StageCosts>& stages,
                                    const parallel::Schedule& schedule, int rank, const PlanSettings& settings,
                                    int devices_per_node, PlanCache& cache) {
  RankModel model = rank_model(l, stages, schedule, rank);
  // (The placement matters with several chunks: interleaved and zb-v hold other virtual stages.)
  const auto [h1, h2] = model_signature(model);
  const std::string key = fmt::format("{}/{}/{}/{}/{}/{}/{}/{}/{}/{:x}{:x}", l.dp, l.tp, l.pp, l.chunks,
                                      l.chunks > 1 ? l.schedule : "", l.stage, l.micro_batches, l.sequence_parallel,
                                      l.offload_optimizer, h1, h2);
  return cache.get(key, [&] {
    plan::PlanInputs in;
    in.model = std::move(model.spec);
    in.step_schedule = std::move(model.step);
    in.options = planned_options(l, settings.engine, devices_per_node);
    in.world_size = l.dp;
    in.tp = l.tp;
    in.pp = l.pp;
    in.finalizers = parallel::model_parallel_finalizers;
    if (l.pp > 1) in.model_parallel_units = stages.front().units;
    return plan::plan_engine(in);
  });
}

// The micro-steps of a step whose gradients are reduced at their end: without a pipeline each
// micro-batch is a micro-step, and each reduces unless the options defer all but the last
// (micro_batch_reduce once); a pipeline's micro-batches are one micro-step.
int reducing_micro_steps(const Layout& l, const EngineOptions& options) {
  return l.pp == 1 && options.micro_batch_reduce != MicroBatchReduce::kOnce ? l.micro_batches : 1;
}

// The part of a data-parallel collective's time a rank waits for, given the compute it can hide
// behind: the last unit's reduction (and at stage 3 the first unit's gather) waits for nothing to
// hide behind, so one unit's share is exposed at least.
double exposed_collectives(double collectives, double window, int units) {
  return std::max(collectives - window, collectives / std::max(1, units));
}

// The part of a layout's step that needs no engine plan: each virtual stage's forward, input and
// weight parts with their tp collectives, through the pipeline simulator (or the one stage's
// micro-batches one after another), and each pipeline rank's time after it (set_rank_tails).
struct PipelineTime {
  parallel::ActionCosts costs;        // per virtual stage
  std::vector<double> tp, optimizer;  // per pipeline rank and step
  // Per pipeline rank and step, over the chunks it holds: its backward (input and weight parts) and
  // its forward, what its data-parallel collectives can hide behind.
  std::vector<double> backward_window, forward_window;
  // The least the data-parallel collectives and the optimizer add after the pipeline, on the rank
  // where that is most (set_rank_tails).
  double tail_floor = 0;
  double tail_floor_exposed = 0;  // of which the collectives' exposed part
  std::vector<double> busy;           // per pipeline rank: its compute per step
  std::vector<double> tp_syncs;       // per pipeline rank: its tp collectives priced from the link
  std::vector<double> receives;       // per pipeline rank: the activations and gradients it waits for
  TimeParts time;                     // compute, tp_comm and bubble
  double bubble_fraction = 0;
  // Per pipeline rank: the most activation bytes it holds at once over all its chunks, the
  // schedule's replay (parallel::HeldTracker, the simulator's and ZB-H1's generator's own) from the
  // stages' sizes (costs.held).
  std::vector<uint64_t> activations;
  // No step is shorter (sync waits and the engine's own tp collectives are at least nothing).
  double floor() const { return time.compute + time.bubble + tail_floor; }
};

PipelineTime pipeline_time(const Layout& l, const std::vector<StageCosts>& stages, const parallel::Schedule& schedule,
                           const Cluster& cluster) {
  PipelineTime out;
  // In a pipeline the simulator shares the cores instead of slowing each rank (a rank in its
  // bubble frees its share): each pipeline gets devices / (dp x tp) of them.
  const double slow = shared_core_slowdown(l, cluster);
  const double pipeline_cores =
      cluster.shared_cores ? static_cast<double>(cluster.devices()) / static_cast<double>(l.dp * l.tp) : 0.0;
  const double compute_slow = l.pp > 1 ? 1.0 : slow;  // the simulator's cores slow a pipeline's compute
  const Link& tp_link = link_for(cluster, l.tp);
  const Link& pp_link = link_for(cluster, l.world());
  parallel::ActionCosts& costs = out.costs;
  costs.forward.assign(stages.size(), 0.0);
  costs.backward = costs.weight = costs.forward;
  out.tp.assign(static_cast<size_t>(l.pp), 0.0);
  out.busy = out.tp_syncs = out.receives = out.backward_window = out.forward_window = out.tp;
  for (size_t k = 0; k < stages.size(); ++k) {
    const StageCosts& c = stages[k];
    const auto rank = static_cast<size_t>(schedule.rank_of(static_cast<int>(k)));
    const double tf = tp_time(c.tp_forward, l.tp, tp_link), tb = tp_time(c.tp_backward, l.tp, tp_link);
    costs.forward[k] = c.forward * compute_slow + tf;
    costs.backward[k] = c.backward_input * compute_slow + tb;
    costs.weight[k] = c.backward_weight * compute_slow;
    out.tp[rank] += (tf + tb) * l.micro_batches;
    out.tp_syncs[rank] += static_cast<double>(c.tp_forward.size() + c.tp_backward.size()) * l.micro_batches;
    out.backward_window[rank] += (costs.backward[k] + costs.weight[k]) * l.micro_batches;
    out.forward_window[rank] += costs.forward[k] * l.micro_batches;
    costs.transfer = std::max(costs.transfer, l.pp > 1 ? pp_link.time(c.send_bytes) : 0.0);
  }
  costs.held = held_bytes(stages);
  if (l.pp > 1) {
    for (size_t r = 0; r < out.receives.size(); ++r) {
      for (const parallel::Action& a : schedule.actions[r]) {
        if (parallel::is_receive(a.op)) out.receives[r] += 1;
      }
    }
    const parallel::SimResult sim = parallel::simulate_checked(schedule, costs, pipeline_cores, parallel::Record::kTimes);
    const size_t busiest = static_cast<size_t>(std::max_element(sim.busy.begin(), sim.busy.end()) - sim.busy.begin());
    out.time.compute = sim.busy[busiest];
    out.time.bubble = sim.step_time - sim.busy[busiest];
    out.time.tp_comm = out.tp[busiest];
    out.bubble_fraction = sim.bubble_fraction;
    out.busy = sim.busy;
    for (double peak : sim.peak_held) out.activations.push_back(static_cast<uint64_t>(std::llround(peak)));
  } else {
    out.time.compute = (costs.forward[0] + costs.backward[0] + costs.weight[0]) * l.micro_batches;
    out.time.tp_comm = out.tp[0];  // the one stage
    out.busy = {out.time.compute};
    out.activations = {static_cast<uint64_t>(std::llround(parallel::peak_held(schedule, costs.held).front()))};
  }
  return out;
}

// What the data-parallel collectives of pipeline rank `r` can hide behind: on separate engines,
// the backward that follows a gradient's completion (and at stage 3 the forward the gathers are
// prefetched into), over every chunk of the rank; on shared cores, nothing.
double overlap_window(const PipelineTime& pipe, const Layout& l, const Cluster& cluster, int r) {
  if (cluster.shared_cores) return 0.0;
  const auto k = static_cast<size_t>(r);
  return pipe.backward_window[k] + (l.stage == 3 ? pipe.forward_window[k] : 0.0);
}

// Each pipeline rank's time after its pipeline, the one part of PipelineTime that depends on the
// ZeRO stage and offload (so the layouts that differ only in those share the rest): its optimizer
// over its shard (on the host with offload, its gradients going down and its parameters up), and
// the floor of that tail with its data-parallel collectives. Those move every trainable element at
// least twice at every stage: an all-reduce of the gradients at stage 0, or a reduce-scatter of
// them and an all-gather of the parameters (stages 1-3), each in the tensor's dtype or wider and
// (a ring, or HSDP's groups) 2 (n - 1) / n of its bytes per rank, less a thousandth for the byte
// the tallies round off per call.
void set_rank_tails(PipelineTime& pipe, const Layout& l, const std::vector<StageCosts>& stages,
                    const std::vector<RankTensors>& ranks, const Cluster& cluster) {
  const double slow = shared_core_slowdown(l, cluster);
  const Link& dp_link = link_for(cluster, l.tp * l.dp);
  pipe.optimizer.assign(static_cast<size_t>(l.pp), 0.0);
  pipe.tail_floor = pipe.tail_floor_exposed = 0;
  for (int r = 0; r < l.pp; ++r) {
    const RankTensors& tensors = ranks[static_cast<size_t>(r)];
    const double elements = static_cast<double>(tensors.numel) / (l.stage >= 1 ? l.dp : 1);
    double& optimizer = pipe.optimizer[static_cast<size_t>(r)];
    optimizer = elements / cluster.optimizer_rate * slow;
    if (l.offload_optimizer) {
      const double host_rate = cluster.host_optimizer_rate > 0 ? cluster.host_optimizer_rate : cluster.optimizer_rate;
      const double bytes = elements * 2 * dtype_size(stages.front().engine->dtype);
      optimizer = elements / host_rate * slow + (cluster.host_link ? cluster.host_link->time(bytes) : 0.0);
    }
    double least = 0;
    if (l.dp > 1) {
      const double n = l.dp;
      least = 0.999 * 2 * (n - 1) / n * static_cast<double>(tensors.bytes) / dp_link.bandwidth;
    }
    const double exposed = exposed_collectives(least, overlap_window(pipe, l, cluster, r), stages.front().units);
    if (exposed + optimizer >= pipe.tail_floor) {
      pipe.tail_floor = exposed + optimizer;
      pipe.tail_floor_exposed = exposed;
    }
  }
}

Prediction predict_stages(const Layout& l, const std::vector<StageCosts>& stages, const parallel::Schedule& schedule,
                          const PipelineTime& pipe, const ModelCosts& model, const Cluster& cluster,
                          const PlanSettings& settings, PlanCache& cache) {
  Prediction out;
  out.layout = l;
  out.time = pipe.time;
  out.bubble_fraction = pipe.bubble_fraction;
  const Link& dp_link = link_for(cluster, l.tp * l.dp);
  double after_pipeline = 0;
  uint64_t worst_memory = 0;
  for (int r = 0; r < l.pp; ++r) {
    // The engine of this pipeline rank on the meta device: its memory and its data-parallel traffic.
    const plan::EnginePlan& p = engine_plan(l, stages, schedule, r, settings, cluster.devices_per_node, cache);
    MemoryParts m = memory_of(p, l.stage);
    m.activations = pipe.activations[static_cast<size_t>(r)];
    out.largest_activations = std::max(out.largest_activations, m.activations);
    if (m.device() >= worst_memory) {
      worst_memory = m.device();
      out.memory = m;
      out.memory_stage = r;
    }
    // Its data-parallel collectives, and its own over the tp group (the partial gradients of the
    // parameters sequence parallelism replicates, the norm's sum).
    const double engine_tp = engine_collectives_time(p.tp_traffic, l.tp, link_for(cluster, l.tp), cluster.copy);
    // hpZ's and qgZ's groups: a node's data-parallel ranks, and the ranks of one place on every node.
    const int node = p.node_size;
    const double nodes = engine_collectives_time(p.node_traffic, node, link_for(cluster, l.tp * node), cluster.copy) +
                         engine_collectives_time(p.across_traffic, l.dp / std::max(1, node), dp_link, cluster.copy);
    const double dp = engine_collectives_time(p.traffic, l.dp, dp_link, cluster.copy) + nodes + engine_tp;
    const double exposed = exposed_collectives(dp, overlap_window(pipe, l, cluster, r), stages.front().units);
    // Its waits for the slowest rank: with dp above 1 the end of each micro-step that reduces
    // (Engine::finish_backward completes its reductions before the next compute) and each
    // all-gather (what follows waits for it: at stage 3 each unit's parameters before its compute,
    // from stage 1 the update's block sums before the norm and, below stage 3, the updated
    // parameters before the next forward); each tp collective priced from the link; in a pipeline
    // each receive (the simulator makes a stage wait for its sender's planned time, not for the
    // sender's own delays). One drift over the rank's compute, whatever the count.
    double syncs = pipe.tp_syncs[static_cast<size_t>(r)] + pipe.receives[static_cast<size_t>(r)];
    if (l.dp > 1) {
      syncs += reducing_micro_steps(l, settings.engine);
      for (const auto* traffic : {&p.traffic, &p.node_traffic}) {
        const auto gathers = traffic->find("all_gather");
        if (gathers != traffic->end()) syncs += static_cast<double>(gathers->second.calls);
      }
    }
    const double sync = cluster.sync.time(syncs, pipe.busy[static_cast<size_t>(r)]);
    const double optimizer = pipe.optimizer[static_cast<size_t>(r)];
    if (exposed + sync + optimizer >= after_pipeline) {
      after_pipeline = exposed + sync + optimizer;
      out.time.dp_comm = dp;
      out.time.engine_tp = engine_tp;
      out.time.dp_exposed = exposed;
      out.time.sync = sync;
      out.time.syncs = syncs;
      out.time.optimizer = optimizer;
    }
  }
  out.fits = out.memory.device() <= static_cast<uint64_t>(cluster.usable_memory());
  out.tokens_per_s = settings.global_batch * static_cast<double>(model.sequence_length()) / out.time.step();
  return out;
}

// Runs work(i) for i = 0, 1, ... count - 1 on `threads` threads (this one among them), each taking
// the next index until none is left or stop() says so; between its items this thread calls
// between() (where the search reports its progress). The first exception any item throws ends the
// others' taking and is thrown here once they are done.
void for_each_index(size_t count, int threads, const std::function<void(size_t)>& work,
                      const std::function<bool()>& stop, const std::function<void()>& between) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](bool reporter) {
    for (;;) {
      if (failed.load() || stop()) return;
      const size_t i = next.fetch_add(1);
      if (i >= count) return;
      try {
        work(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
      if (reporter) between();
    }
  };
  std::vector<std::thread> helpers;
  const size_t extra = static_cast<size_t>(std::max(1, threads)) - 1;
  for (size_t t = 0; t < std::min(extra, count); ++t) helpers.emplace_back(run, false);
  run(true);
  for (std::thread& t : helpers) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

EngineOptions planned_options(const Layout& layout, const EngineOptions& base, int devices_per_node) {
  EngineOptions o = engine_options(layout, base);
  if (layout.stage != 3) {
    o.quantized_weights = {};
    o.quantized_gradients = {};
    o.secondary_shard = false;
  }
  if ((o.secondary_shard || o.quantized_gradients.bits != 0) && o.node_size == 0) {
    o.node_size = std::gcd(layout.dp, std::max(1, devices_per_node / layout.tp));
  }
  return o;
}

Prediction predict(const ModelCosts& model, const Layout& l, const Cluster& cluster, const PlanSettings& settings) {
  Prediction out;
  out.layout = l;
  out.unsupported = model.unsupported(l, settings.global_batch);
  if (!out.unsupported.empty()) return out;
  PlanCache cache;
  const std::vector<StageCosts> stages = stage_costs(model, l, cluster, settings);
  const parallel::Schedule schedule = Schedules().of(l, stages);
  PipelineTime pipe = pipeline_time(l, stages, schedule, cluster);
  set_rank_tails(pipe, l, stages, ranks_tensors(l, stages), cluster);
  return predict_stages(l, stages, schedule, pipe, model, cluster, settings, cache);
}

// The micro-batch counts a replica of dp ranks tries: about pp x 1, 2, 4, ... while a micro-batch
// keeps a sequence (smaller ones hold fewer activations and, in a pipeline, leave a smaller bubble).
// For each target the smallest count at or above it that divides the replica's batch, and the
// smallest such multiple of pp (the interleaved schedule's need): a batch without a factor of pp
// (BLOOM's 2048 over pp 12) still gets counts, and pp x 2^k is kept wherever it divides.
std::vector<int> micro_batch_counts(int global_batch, int dp, int pp) {
  std::set<int> out;
  if (global_batch % dp != 0) return {};
  const int replica = global_batch / dp;
  for (int target = pp; target <= replica; target *= 2) {
    int any = 0, of_pp = 0;
    for (int m = target; m <= replica && (any == 0 || of_pp == 0); ++m) {
      if (replica % m != 0) continue;
      if (any == 0) any = m;
      if (of_pp == 0 && m % pp == 0) of_pp = m;
    }
    for (int m : {any, of_pp}) {
      if (m > 0) out.insert(m);
    }
  }
  return {out.begin(), out.end()};
}

std::vector<Layout> enumerate_layouts(const ModelCosts& model, int world, int global_batch) {
  constexpr int kMaxChunks = 16;
  if (world < 1) ZERO_THROW(InvalidArgument, "enumerate_layouts: world {} is not positive", world);
  std::vector<Layout> out;
  for (int tp : divisors(world)) {
    for (int pp : divisors(world / tp)) {
      const int dp = world / (tp * pp);
      for (int stage = 0; stage <= 3; ++stage) {
        for (int m : micro_batch_counts(global_batch, dp, pp)) {
          // The schedules with their chunks per rank: interleaved at 2, 4, 8, ... chunks (up to what
          // the model refuses, e.g. more virtual stages than layers).
          std::vector<std::pair<std::string, int>> schedules = {{"1f1b", 1}};
          if (pp > 1) {
            schedules = {{"gpipe", 1}, {"1f1b", 1}, {"zb-h1", 1}, {"zb-v", 2}};
            for (int v = 2; v <= kMaxChunks; v *= 2) schedules.push_back({"interleaved", v});
          }
          for (const auto& [schedule, chunks] : schedules) {
            for (bool sp : {false, true}) {
              if (sp && tp == 1) continue;
              for (bool offload : {false, true}) {
                if (offload && stage == 0) continue;
                for (bool recompute : {false, true}) {
                  Layout l{dp, tp, pp, stage, m, schedule, chunks, sp, offload, recompute};
                  if (model.unsupported(l, global_batch).empty()) out.push_back(l);
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

// rank_layouts' order (below).
void sort_ranked(std::vector<Prediction>& out);

std::vector<Prediction> rank_layouts(const ModelCosts& model, const std::vector<Layout>& layouts, const Cluster& cluster,
                                     const PlanSettings& settings, size_t exact) {
  exact = std::max<size_t>(exact, 1);
  const int threads = std::max(1, settings.threads);
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  auto out_of_time = [&] {
    return settings.time_limit > 0 &&
           std::chrono::duration<double>(Clock::now() - started).count() >= settings.time_limit;
  };
  std::vector<Prediction> out;
  PlanCache cache;
  Schedules schedules;
  const uint64_t device = static_cast<uint64_t>(cluster.usable_memory());
  // Progress, every settings.progress_seconds and at the end (from this thread only).
  SearchProgress progress;
  progress.layouts = layouts.size();
  auto reported = Clock::now();
  auto report = [&](bool last) {
    if (!settings.progress) return;
    const auto now = Clock::now();
    if (!last && std::chrono::duration<double>(now - reported).count() < settings.progress_seconds) return;
    reported = now;
    progress.done = last;
    settings.progress(progress);
  };

  // The layouts that differ only in their ZeRO stage and offload share a group: those change
  // neither the model's stages nor the schedule, only the optimizer's time and the engine, so the
  // stages, the simulation and the ranks' tallies are made once for the seven of them.
  struct Group {
    Layout first;
    size_t members = 0;
    bool done = false;  // made (a time limit may stop the search before)
    std::shared_ptr<const std::vector<StageCosts>> stages;
    std::vector<RankTensors> ranks;
    PipelineTime pipe;
  };
  std::map<std::tuple<int, int, int, int, std::string, int, bool, bool>, size_t> group_of;
  std::vector<Group> groups;
  std::vector<size_t> layout_group(layouts.size(), SIZE_MAX);  // SIZE_MAX: the model cannot run it
  for (size_t i = 0; i < layouts.size(); ++i) {
    const Layout& l = layouts[i];
    if (!model.unsupported(l, settings.global_batch).empty()) {
      out.push_back(predict(model, l, cluster, settings));
      ++progress.examined;
      continue;
    }
    const auto key = std::make_tuple(l.dp, l.tp, l.pp, l.micro_batches, l.schedule, l.chunks, l.sequence_parallel,
                                     l.recompute);
    const auto [it, added] = group_of.emplace(key, groups.size());
    if (added) groups.push_back(Group{.first = l});
    ++groups[it->second].members;
    layout_group[i] = it->second;
  }
  // The groups on the search's threads, in the order given (a time limit leaves the last unmade).
  std::atomic<size_t> examined{progress.examined};
  for_each_index(
      groups.size(), threads,
      [&](size_t g) {
        Group& group = groups[g];
        group.stages = std::make_shared<const std::vector<StageCosts>>(
            stage_costs(model, group.first, cluster, settings));
        group.pipe = pipeline_time(group.first, *group.stages, schedules.of(group.first, *group.stages), cluster);
        group.ranks = ranks_tensors(group.first, *group.stages);
        group.done = true;
        examined += group.members;
      },
      out_of_time,
      [&] {
        progress.examined = examined.load();
        report(false);
      });
  progress.examined = examined.load();

  // Each layout's floors from its group's.
  struct Candidate {
    Layout layout;
    std::shared_ptr<const std::vector<StageCosts>> stages;
    MemoryFloor floor;
    PipelineTime pipe;
  };
  std::vector<Candidate> candidates, too_large;
  std::vector<Layout> not_examined;
  for (size_t i = 0; i < layouts.size(); ++i) {
    if (layout_group[i] == SIZE_MAX) continue;
    const Group& group = groups[layout_group[i]];
    if (!group.done) {
      not_examined.push_back(layouts[i]);
      continue;
    }
    Candidate c{layouts[i], group.stages, {}, group.pipe};
    set_rank_tails(c.pipe, c.layout, *c.stages, group.ranks, cluster);
    c.floor = memory_floor(c.layout, group.ranks, c.pipe.activations, settings.engine);
    if (c.floor.device <= device) {
      ++progress.fitting_floors;
      const double floor = c.pipe.floor();
      if (progress.fastest_floor == 0 || floor < progress.fastest_floor) progress.fastest_floor = floor;
    }
    (c.floor.device <= device ? candidates : too_large).push_back(std::move(c));
  }
  report(false);
  auto plan = [&](const Candidate& c) {
    Prediction p;
    try {
      p = predict_stages(c.layout, *c.stages, schedules.of(c.layout, *c.stages), c.pipe, model, cluster, settings,
                         cache);
    } catch (const InvalidArgument& e) {
      // A layout the engine refuses (its options cannot run the model) is not one to run: named, and
      // the search goes on.
      p.layout = c.layout;
      p.unsupported = fmt::format("the engine refuses it: {}", e.what());
      return p;
    }
    p.memory_floor = c.floor.device;
    p.time_floor = c.pipe.floor();
    return p;
  };
  // Plan the candidates in the order of their time floors; once `exact` fit, a floor above the
  // slowest of them cannot rank among them, nor can any after it. The threads plan the next few at
  // once; their results are taken in order as planning one at a time would (one past the bound is
  // dropped), so the answer and the table do not depend on the number of threads.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.pipe.floor() < b.pipe.floor(); });
  std::priority_queue<double> fastest;  // the `exact` fastest fitting steps so far, the slowest on top
  auto beyond_bound = [&](size_t i) { return fastest.size() >= exact && candidates[i].pipe.floor() > fastest.top(); };
  size_t next = 0;
  bool timed_out = false;
  while (next < candidates.size() && !beyond_bound(next)) {
    if (out_of_time()) {
      timed_out = true;
      break;
    }
    size_t end = next;
    while (end < candidates.size() && end - next < static_cast<size_t>(threads) && !beyond_bound(end)) ++end;
    std::vector<Prediction> planned(end - next);
    for_each_index(
        planned.size(), threads, [&](size_t i) { planned[i] = plan(candidates[next + i]); }, [] { return false; },
        [] {});
    for (Prediction& p : planned) {
      if (beyond_bound(next)) break;
      out.push_back(std::move(p));
      ++next;
      ++progress.planned;
      if (out.back().fits) {
        fastest.push(out.back().time.step());
        if (fastest.size() > exact) fastest.pop();
        if (!progress.best || out.back().time.step() < progress.best_step) {
          progress.best = out.back().layout;
          progress.best_step = out.back().time.step();
        }
      }
    }
    report(false);
  }
  auto floor_of = [](const Candidate& c, Estimate estimate) {
    Prediction p;
    p.layout = c.layout;
    p.estimate = estimate;
    p.memory_floor = c.floor.device;
    p.time_floor = c.pipe.floor();
    p.largest_activations = p.memory.activations = c.floor.activations;
    p.memory.engine_peak = c.floor.device - c.floor.activations;  // the device floor holds the largest peak
    return p;
  };
  for (size_t i = next; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    Prediction p = floor_of(c, timed_out ? Estimate::kNotPlanned : Estimate::kTooSlow);
    p.time = c.pipe.time;
    p.time.optimizer = c.pipe.tail_floor - c.pipe.tail_floor_exposed;
    p.time.dp_exposed = c.pipe.tail_floor_exposed;
    p.bubble_fraction = c.pipe.bubble_fraction;
    p.tokens_per_s = settings.global_batch * static_cast<double>(model.sequence_length()) / p.time.step();
    out.push_back(p);
  }
  // Nothing fits: plan the smallest floors until no unplanned layout can be smaller than a planned one.
  const bool any_fits = !fastest.empty();
  std::stable_sort(too_large.begin(), too_large.end(),
                   [](const Candidate& a, const Candidate& b) { return a.floor.device < b.floor.device; });
  uint64_t smallest = UINT64_MAX;
  for (const Prediction& p : out) {
    if (p.unsupported.empty()) smallest = std::min(smallest, p.memory.device());
  }
  size_t planned = 0;
  while (!any_fits && !timed_out && planned < too_large.size() && too_large[planned].floor.device < smallest) {
    out.push_back(plan(too_large[planned++]));
    ++progress.planned;
    smallest = std::min(smallest, out.back().memory.device());
    timed_out = out_of_time();
  }
  for (size_t i = planned; i < too_large.size(); ++i) out.push_back(floor_of(too_large[i], Estimate::kTooLarge));
  for (const Layout& l : not_examined) {
    Prediction p;
    p.layout = l;
    p.estimate = Estimate::kNotExamined;
    out.push_back(p);
  }
  report(true);
  sort_ranked(out);
  return out;
}

EngineOptions zeropp_options(const EngineOptions& base, const std::string& zeropp) {
  EngineOptions o = base;
  if (zeropp.empty()) return o;
  o.quantized_weights = {.bits = 8};
  o.secondary_shard = zeropp.find("hpZ") != std::string::npos;
  o.quantized_gradients = {.bits = zeropp.find("qgZ") != std::string::npos ? 4 : 0};
  ZERO_CHECK(zeropp == "qwZ int8" || zeropp == "qwZ int8 + hpZ" || zeropp == "qwZ int8 + hpZ + qgZ int4",
             "unknown ZeRO++ variant '{}'", zeropp);
  return o;
}

std::vector<Prediction> rank_layouts_with_zeropp(const ModelCosts& model, const std::vector<Layout>& layouts,
                                                 const Cluster& cluster, const PlanSettings& settings, size_t exact) {
  std::vector<Prediction> out = rank_layouts(model, layouts, cluster, settings, exact);
  std::vector<Layout> stage3;
  for (const Layout& l : layouts) {
    if (l.stage == 3 && l.dp > 1) stage3.push_back(l);
  }
  if (stage3.empty()) return out;
  std::map<std::string, size_t> at;  // layout -> its place in `out`
  for (size_t i = 0; i < out.size(); ++i) at[layout_key(out[i].layout)] = i;
  for (const char* name : {"qwZ int8", "qwZ int8 + hpZ", "qwZ int8 + hpZ + qgZ int4"}) {
    PlanSettings s = settings;
    s.engine = zeropp_options(settings.engine, name);
    for (Prediction& p : rank_layouts(model, stage3, cluster, s, exact)) {
      if (p.estimate != Estimate::kExact || !p.fits) continue;
      Prediction& current = out[at.at(layout_key(p.layout))];
      if (current.fits && current.estimate == Estimate::kExact && current.time.step() <= p.time.step()) continue;
      p.zeropp = name;
      current = std::move(p);
    }
  }
  sort_ranked(out);
  return out;
}

void sort_ranked(std::vector<Prediction>& out) {
  // Fitting first, fastest first (equal times: the smaller); then the too slow and the unplanned,
  // by their floors; then the rest, smallest first; the unexamined last.
  auto group = [](const Prediction& p) {
    if (p.fits) return 0;
    if (p.estimate == Estimate::kTooSlow || p.estimate == Estimate::kNotPlanned) return 1;
    return p.estimate == Estimate::kNotExamined ? 3 : 2;
  };
  std::stable_sort(out.begin(), out.end(), [&](const Prediction& a, const Prediction& b) {
    if (group(a) != group(b)) return group(a) < group(b);
    if (group(a) == 3) return false;
    if (group(a) == 2 || a.time.step() == b.time.step()) return a.memory.device() < b.memory.device();
    return a.time.step() < b.time.step();
  });
}

// The layout, with the ZeRO++ parts rank_layouts_with_zeropp chose for it.
std::string described(const Prediction& p) {
  return p.zeropp.empty() ? describe(p.layout) : describe(p.layout) + " + " + p.zeropp;
}

std::string table(const std::vector<Prediction>& ranked, size_t limit) {
  using memory::format_bytes;
  // One row's cells after its number and layout: memory by category, step, tokens/s, bubble, dp,
  // and a remark. A layout not planned has floors: the activations exact, the device at least
  // their sum with the parameters kept, and (too slow) the step at least its pipeline's.
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  size_t width = 6;
  for (size_t i = 0; i < ranked.size() && i < limit; ++i) {
    const Prediction& p = ranked[i];
    const MemoryParts& m = p.memory;
    std::vector<std::string> cells;
    if (p.estimate == Estimate::kExact) {
      cells = {format_bytes(m.params), format_bytes(m.grads), format_bytes(m.master), format_bytes(m.optimizer),
               format_bytes(m.buffers), format_bytes(m.window), format_bytes(m.activations), format_bytes(m.device()),
               fmt::format("{:.2f}", 1e3 * p.time.step()), fmt::format("{:.0f}", p.tokens_per_s),
               fmt::format("{:.1f}%", 100 * p.bubble_fraction), fmt::format("{:.2f}", 1e3 * p.time.dp_exposed),
               p.fits ? "" : "does not fit"};
    } else if (p.estimate == Estimate::kNotExamined) {
      cells = {"-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "not examined (time limit)"};
    } else {
      const bool timed = p.estimate != Estimate::kTooLarge;  // too slow or not planned: a time floor
      cells = {"-", "-", "-", "-", "-", "-", format_bytes(m.activations), ">" + format_bytes(m.device()),
               timed ? fmt::format(">{:.2f}", 1e3 * p.time.step()) : "-",
               timed ? fmt::format("<{:.0f}", p.tokens_per_s) : "-",
               timed ? fmt::format("{:.1f}%", 100 * p.bubble_fraction) : "-", "-",
               p.estimate == Estimate::kTooSlow     ? "slower (at least)"
               : p.estimate == Estimate::kNotPlanned ? "not planned (time limit; at least)"
                                                     : "does not fit (at least)"};
    }
    rows.emplace_back(described(p), std::move(cells));
    width = std::max(width, rows.back().first.size());
  }
  auto line = [&](const std::string& number, const std::string& layout, const std::vector<std::string>& c) {
    std::string out = fmt::format("{:>4}  {:<{}} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  {:>9} {:>11} {:>7} {:>9}",
                                  number, layout, width, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9],
                                  c[10], c[11]);
    return out + (c[12].empty() ? "" : "  " + c[12]) + "\n";
  };
  std::string s = line("#", "layout", {"params", "grads", "master", "optimizer", "buffers", "window", "activ.", "device",
                                       "step ms", "tokens/s", "bubble", "dp ms", ""});
  for (size_t i = 0; i < rows.size(); ++i) s += line(std::to_string(i + 1), rows[i].first, rows[i].second);
  return s;
}

std::string reason(const std::vector<Prediction>& ranked) {
  using memory::format_bytes;
  if (ranked.empty()) return "no layout: the model supports none at this world size and batch";
  size_t fitting = 0, slower = 0, not_planned = 0, not_examined = 0;
  for (const Prediction& p : ranked) {
    fitting += p.fits ? 1 : 0;
    slower += p.estimate == Estimate::kTooSlow ? 1 : 0;
    not_planned += p.estimate == Estimate::kNotPlanned ? 1 : 0;
    not_examined += p.estimate == Estimate::kNotExamined ? 1 : 0;
  }
  // What a time limit left out: the answer is the best of the rest.
  const std::string cut =
      not_planned + not_examined == 0
          ? ""
          : fmt::format("; the time limit ended the search with {} layouts not examined and {} whose floors were "
                        "made not planned (the fastest floor among these {:.2f} ms)",
                        not_examined, not_planned, [&] {
                          double least = 0;
                          for (const Prediction& p : ranked) {
                            if (p.estimate == Estimate::kNotPlanned && (least == 0 || p.time.step() < least)) {
                              least = p.time.step();
                            }
                          }
                          return 1e3 * least;
                        }());
  const Prediction& best = ranked.front();
  if (!best.fits) {
    if (best.estimate == Estimate::kNotPlanned || best.estimate == Estimate::kNotExamined) {
      return "no layout planned in time fits" + cut;
    }
    return fmt::format("no layout fits: the smallest, {}, needs {} per device ({} of it activations){}",
                       describe(best.layout), format_bytes(best.memory.device()), format_bytes(best.memory.activations),
                       cut);
  }
  std::string s = fmt::format("{}: the fastest of {} layouts that fit{} ({:.2f} ms per step, {})", described(best),
                              fitting, slower > 0 ? fmt::format(" and {} more whose floors are slower", slower) : "",
                              1e3 * best.time.step(), format_bytes(best.memory.device()));
  if (fitting > 1) {
    const Prediction& next = ranked[1];
    s += fmt::format("; next {} at {:.2f} ms ({:+.1f}%)", described(next), 1e3 * next.time.step(),
                     100 * (next.time.step() / best.time.step() - 1));
  }
  return s + cut;
}

std::string explain(const Prediction& p) {
  using memory::format_bytes;
  if (!p.unsupported.empty()) return fmt::format("{}: not possible: {}\n", describe(p.layout), p.unsupported);
  const MemoryParts& m = p.memory;
  const TimeParts& t = p.time;
  std::string s = fmt::format("{}\n", describe(p.layout));
  s += fmt::format("  memory per rank (pipeline stage {}): {}{}\n", p.memory_stage, format_bytes(m.device()),
                   p.fits ? "" : " (does not fit)");
  s += fmt::format("    engine peak {} (params {}, grads {}, master {}, optimizer {}, buffers {}, window {})\n",
                   format_bytes(m.engine_peak), format_bytes(m.params), format_bytes(m.grads), format_bytes(m.master),
                   format_bytes(m.optimizer), format_bytes(m.buffers), format_bytes(m.window));
  s += fmt::format("    activations at the schedule's peak {}\n", format_bytes(m.activations));
  if (m.host > 0) s += fmt::format("    host (offload) {}\n", format_bytes(m.host));
  s += fmt::format("  time per step: {:.3f} ms, {:.0f} tokens/s\n", 1e3 * t.step(), p.tokens_per_s);
  s += fmt::format("    compute {:.3f} ms (of which tp collectives {:.3f} ms)\n", 1e3 * t.compute, 1e3 * t.tp_comm);
  s += fmt::format("    pipeline bubble {:.3f} ms ({:.1f}% of the pipeline)\n", 1e3 * t.bubble, 100 * p.bubble_fraction);
  s += fmt::format("    the engine's collectives {:.3f} ms (dp, and {:.3f} ms its own over tp), exposed {:.3f} ms\n",
                   1e3 * t.dp_comm, 1e3 * t.engine_tp, 1e3 * t.dp_exposed);
  if (t.sync > 0) {
    s += fmt::format("    waits for the slowest rank {:.3f} ms ({:.0f} synchronizations)\n", 1e3 * t.sync, t.syncs);
  }
  s += fmt::format("    optimizer {:.3f} ms\n", 1e3 * t.optimizer);
  return s;
}

}  // namespace zero::strategy
