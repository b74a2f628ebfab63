#include "zero/memory_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "base/check.h"
#include "memory/tracker.h"

namespace zero {

MemoryPrediction predict_memory(const MemoryFormulaInputs& in) {
  ZERO_CHECK(in.stage >= 0 && in.stage <= 3, "stage {}", in.stage);
  ZERO_CHECK_GE(in.world_size, 1);
  const uint64_t psi = in.numel;
  const uint64_t n = static_cast<uint64_t>(in.world_size);
  MemoryPrediction p;
  // Bytes of Ψ elements at `per` bytes each (an average where parameters mix dtypes).
  auto bytes = [&](double per) { return static_cast<uint64_t>(per * static_cast<double>(psi)); };
  p.params = in.stage == 3 ? bytes(in.param_bytes) / n : bytes(in.param_bytes);
  const uint64_t sharded = (in.stage == 0) ? 1 : n;
  p.master = 4 * psi / sharded;
  p.optimizer_state = bytes(in.state_bytes) / sharded;
  std::string grads_term;
  if (in.stage >= 2) {
    p.grads = bytes(in.shard_grad_bytes) / n;
    grads_term = fmt::format("{:.3g}Ψ/N", in.shard_grad_bytes);
  } else {
    p.grads = bytes(in.grad_bytes);
    grads_term = fmt::format("{:.3g}Ψ", in.grad_bytes);
    if (in.accumulator) {
      p.grads += 4 * psi / sharded;
      grads_term += in.stage == 0 ? " + 4Ψ" : " + 4Ψ/N";
    }
  }
  const double k = 4 + in.state_bytes;
  const std::string params_term = fmt::format("{:.3g}Ψ{}", in.param_bytes, in.stage == 3 ? "/N" : "");
  const std::string optim_term = fmt::format("{:.3g}Ψ{}", k, in.stage == 0 ? "" : "/N");
  if (in.offload_params) {
    p.offload_params = std::exchange(p.params, 0);
    p.offload_master = std::exchange(p.master, 0);
    p.offload_state = std::exchange(p.optimizer_state, 0);
    p.formula = fmt::format("{}; host {} + {}", grads_term, params_term, optim_term);
  } else if (in.offload_optimizer) {
    p.offload_master = std::exchange(p.master, 0);
    p.offload_state = std::exchange(p.optimizer_state, 0);
    p.formula = fmt::format("{} + {}; host {}", params_term, grads_term, optim_term);
  } else {
    p.formula = fmt::format("{} + {} + {}", params_term, grads_term, optim_term);
  }
  return p;
}

namespace {

uint64_t sum_rows(const std::vector<MemoryReport::Row>& rows, bool host_tier, uint64_t MemoryReport::Row::*field) {
  uint64_t s = 0;
  for (const MemoryReport::Row& r : rows) s += (r.in_formula && r.host_tier == host_tier) ? r.*field : 0;
  return s;
}

double quotient(uint64_t a, uint64_t b) { return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b); }

}  // namespace

uint64_t MemoryReport::formula_current() const { return sum_rows(rows, false, &Row::current); }
uint64_t MemoryReport::formula_predicted() const { return sum_rows(rows, false, &Row::predicted); }
double MemoryReport::ratio() const { return quotient(formula_current(), formula_predicted()); }
bool MemoryReport::offloaded() const {
  return std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.host_tier; });
}
uint64_t MemoryReport::host_current() const { return sum_rows(rows, true, &Row::current); }
uint64_t MemoryReport::host_predicted() const { return sum_rows(rows, true, &Row::predicted); }
double MemoryReport::host_ratio() const { return quotient(host_current(), host_predicted()); }

std::string MemoryReport::table() const {
  using memory::format_bytes;
  std::string s = fmt::format("rank {} memory, stage {}, N = {}, Ψ = {} ({})\n", rank, stage,
                              world_size, numel, formula);
  s += fmt::format("  {:<18} {:>12} {:>12} {:>12}\n", "category", "current", "peak", "predicted");
  for (const Row& r : rows) {
    s += fmt::format("  {:<18} {:>12} {:>12} {:>12}\n", r.category, format_bytes(r.current),
                     format_bytes(r.peak), r.in_formula || r.predicted > 0 ? format_bytes(r.predicted) : "-");
  }
  s += fmt::format("  {:<18} {:>12} {:>12} {:>12}   measured/predicted = {:.3f}\n",
                   offloaded() ? "device formula" : "params+grads+optim", format_bytes(formula_current()), "",
                   format_bytes(formula_predicted()), ratio());
  if (offloaded()) {
    s += fmt::format("  {:<18} {:>12} {:>12} {:>12}   measured/predicted = {:.3f}\n", "host formula",
                     format_bytes(host_current()), "", format_bytes(host_predicted()), host_ratio());
  }
  return s;
}

const char* memory_column_name(MemoryColumn c) {
  switch (c) {
    case MemoryColumn::kParams: return "params";
    case MemoryColumn::kGrads: return "grads";
    case MemoryColumn::kMaster: return "master";
    case MemoryColumn::kOptimizer: return "optim";
    case MemoryColumn::kBuffers: return "buckets";
    case MemoryColumn::kWindow: return "window";
    case MemoryColumn::kHost: return "host";
    case MemoryColumn::kScratch: return "scratch";
    case MemoryColumn::kNone: break;
  }
  return "none";
}

std::vector<uint64_t> MemoryReport::column_peaks() const {
  std::vector<uint64_t> out(kNumMemoryColumns, 0);
  for (const Row& r : rows) {
    if (r.column != MemoryColumn::kNone) out[static_cast<size_t>(r.column)] += r.peak;
  }
  return out;
}

MemoryReport build_memory_report(const EngineMemory& em) {
  using memory::Category;
  MemoryFormulaInputs in = em.formula;
  in.numel = 0;
  for (int id : em.registry->trainable()) in.numel += em.registry->numel(id);
  const MemoryPrediction pred = predict_memory(in);

  MemoryReport rep;
  rep.rank = em.rank;
  rep.stage = in.stage;
  rep.world_size = in.world_size;
  rep.numel = in.numel;
  rep.formula = pred.formula;
  using Column = MemoryColumn;
  auto row = [&](const memory::MemoryTracker& t, Category c, const std::string& name, uint64_t predicted,
                 bool in_formula, Column column, bool host_tier = false) {
    const auto u = t.usage(c);
    rep.rows.push_back({name, u.current, u.peak, predicted, in_formula, host_tier, column});
  };
  const memory::MemoryTracker& t = *em.tracker;
  if (in.stage == 3) {
    // The engine keeps the parameter shard; the registered storage only gave the initial values.
    row(t, Category::kParams, "params (shard)", pred.params, true, Column::kParams);
  } else {
    // Parameters are the user's storage: their registered size is what is resident.
    uint64_t param_bytes = 0;
    for (const ParamSpec& p : em.registry->params()) param_bytes += p.data.numel * dtype_size(p.dtype);
    rep.rows.push_back({"params (user)", param_bytes, param_bytes, pred.params, true, false, Column::kParams});
  }
  row(t, Category::kGrads, "grads", pred.grads, true, Column::kGrads);
  row(t, Category::kMasterParams, "master_params", pred.master, true, Column::kMaster);
  row(t, Category::kOptimizerState, "optimizer_state", pred.optimizer_state, true, Column::kOptimizer);
  row(t, Category::kCommBuffer, "comm_buffer", 0, false, Column::kBuffers);
  row(t, Category::kGatherWindow, "gather_window", 0, false, Column::kWindow);
  // hpZ's node parts live beside the window, to the step's end.
  if (in.secondary_shard > 0) {
    row(t, Category::kSecondaryShard, "secondary_shard", in.secondary_shard, false, Column::kWindow);
  }
  if (em.offload_tracker != nullptr) {
    const memory::MemoryTracker& h = *em.offload_tracker;
    if (in.offload_params) row(h, Category::kParams, "offload params", pred.offload_params, true, Column::kHost, true);
    row(h, Category::kMasterParams, "offload master", pred.offload_master, true, Column::kHost, true);
    row(h, Category::kOptimizerState, "offload state", pred.offload_state, true, Column::kHost, true);
    row(h, Category::kOffloadHost, "offload staging", 0, false, Column::kHost, true);
  }
  const memory::MemoryTracker& process = memory::MemoryTracker::global();
  if (&process != em.tracker) row(process, Category::kCommBuffer, "comm (process)", 0, false, Column::kScratch);
  return rep;
}

}  // namespace zero
