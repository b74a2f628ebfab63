#include "zero/sharded_update.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <utility>

#include "base/check.h"
#include "base/fault_injection.h"
#include "base/logging.h"
#include "optim/grad_utils.h"

namespace zero {
ShardedUpdate::ShardedUpdate(UpdateConfig config, const ShardLayout& layout, const ShardOwnership& ownership,
                             comm::Communicator& shard_comm, memory::Device& device,
                             std::unique_ptr<UpdateApplier> applier, ParamWriteback& writeback,
                             std::vector<std::unique_ptr<PartialGradSum>> partial_sums,
                             std::vector<std::unique_ptr<CopiedGradCheck>> copied_checks)
    : config_(std::move(config)), layout_(layout), ownership_(ownership), comm_(shard_comm), device_(device),
      writeback_(writeback), order_(device, shard_comm, config_.timeout), applier_(std::move(applier)),
      sums_ready_(device.create_event()), partial_sums_(std::move(partial_sums)),
      copied_checks_(std::move(copied_checks)) {
  ZERO_CHECK(config_.check_copies || copied_checks_.empty(), "copied gradients' checks without UpdateConfig.check_copies");
  const size_t block = layout_.options().block;
  for (size_t b = 0; b < layout_.buckets().size(); ++b) owned_blocks_ += ownership_.range(b).len / block;
  const size_t world = ownership_.is_replicated() ? 1 : static_cast<size_t>(comm_.size());
  const auto cat = memory::Category::kCommBuffer;
  block_sums_ = device_.allocate_elements(static_cast<int64_t>(owned_blocks_), DType::kFloat64, cat);
  if (world > 1) {
    gathered_sums_ = device_.allocate_elements(static_cast<int64_t>(owned_blocks_ * world), DType::kFloat64, cat);
  }
  host_sums_ = device_.allocate_host_staging(owned_blocks_ * world * sizeof(double), cat);
  // The runs, adjacent equal ones merged, then the open-ended rest.
  for (const BlockRun& r : config_.runs) {
    ZERO_CHECK(runs_.empty() || r.end > runs_.back().end, "UpdateConfig.runs: run ending at block {} is out of order",
               r.end);
    if (!runs_.empty() && runs_.back().unit == r.unit && runs_.back().counted == r.counted) {
      runs_.back().end = r.end;
    } else {
      runs_.push_back(r);
    }
  }
  runs_.push_back({SIZE_MAX, 0, true});
  config_.runs = {};
  int64_t units = 1;
  for (const BlockRun& r : runs_) units = std::max<int64_t>(units, int64_t{r.unit} + 1);
  if (config_.model_parallel != nullptr && config_.model_parallel->size() > 1) {
    mp_order_ = std::make_unique<CollectiveOrder>(device, *config_.model_parallel, config_.timeout);
    // Every rank's per-unit vector has the same length: the largest unit id over the group.
    memory::Buffer n = device_.allocate_elements(1, DType::kInt64, cat);
    memory::Buffer host = device_.allocate_host_staging(sizeof(int64_t), cat);
    memory::Stream& compute = device_.compute_stream();
    *host.as<int64_t>() = units;
    device_.copy(n.data(), host.data(), sizeof(int64_t), compute);
    mp_order_->before_issue(compute);
    mp_order_->after(*config_.model_parallel->all_reduce(n.data(), 1, DType::kInt64, comm::ReduceOp::kMax), compute);
    device_.copy(host.data(), n.data(), sizeof(int64_t), compute);
    device_.synchronize(compute, config_.timeout);
    units = *host.as<int64_t>();
  }
  units_ = static_cast<size_t>(units);
  mp_total_ = device_.allocate_elements(static_cast<int64_t>(units_), DType::kFloat64, cat);
  mp_host_ = device_.allocate_host_staging(units_ * sizeof(double), cat);
  if (config_.check_copies) {
    verdict_ = device_.allocate_elements(1, DType::kFloat32, cat);
    verdict_host_ = device_.allocate_host_staging(sizeof(float), cat);
  }
}

void ShardedUpdate::check_copies(const GradReducer& grads) {
  if (!device_.holds_values()) return;  // a plan: no values to compare, on every rank alike
  CopiedGradCheck::Verdict mine;
  const CopiedGradCheck* where = nullptr;
  for (const auto& check : copied_checks_) {
    CopiedGradCheck::Verdict v = check->run([&](size_t b) { return grads.reduced(b).ptr; });
    if (v.difference > mine.difference) mine = std::move(v), where = check.get();
  }
  // Every rank learns the largest difference any rank found: the ranks holding other pieces (other
  // data-parallel coordinates, other pipeline stages) must stop too, not wait in the next collective.
  memory::Stream& compute = device_.compute_stream();
  float* agreed = verdict_host_.as<float>();
  *agreed = mine.difference;
  device_.copy(verdict_.data(), agreed, sizeof(float), compute);
  if (comm_.size() > 1) {
    order_.before_issue(compute);
    order_.after(*comm_.all_reduce(verdict_.data(), 1, DType::kFloat32, comm::ReduceOp::kMax), compute);
  }
  if (mp_order_) {
    mp_order_->before_issue(compute);
    mp_order_->after(*config_.model_parallel->all_reduce(verdict_.data(), 1, DType::kFloat32, comm::ReduceOp::kMax),
                     compute);
  }
  device_.copy(agreed, verdict_.data(), sizeof(float), compute);
  device_.synchronize(compute, config_.timeout);
  if (!(*agreed > CopiedGradCheck::kTolerance)) return;
  if (where != nullptr && mine.difference > CopiedGradCheck::kTolerance) {
    ZERO_THROW(InvalidArgument,
               "parameter '{}' is held whole on every rank of its {} group, but its gradient differs across them at "
               "the first step (by {:.3g} of its largest value): a parameter whose backward sees only this rank's part "
               "of the input (a LayerNorm or a bias under sequence parallelism) is TpPlacement::replicated_partial(); "
               "one split across the group is TpPlacement::split(dim)",
               mine.name, where->what(), mine.difference);
  }
  ZERO_THROW(InvalidArgument,
             "a parameter held whole on every rank of a model-parallel group has gradients that differ across it at the "
             "first step (by {:.3g} of its largest value); the error on the ranks that hold it names it",
             *agreed);
}

double ShardedUpdate::add_over_model_parallel() {
  double* per_unit = mp_host_.as<double>();
  if (mp_order_) {
    memory::Stream& compute = device_.compute_stream();
    device_.copy(mp_total_.data(), mp_host_.data(), units_ * sizeof(double), compute);
    mp_order_->before_issue(compute);
    mp_order_->after(
        *config_.model_parallel->all_reduce(mp_total_.data(), units_, DType::kFloat64, comm::ReduceOp::kSum), compute);
    device_.copy(mp_host_.data(), mp_total_.data(), units_ * sizeof(double), compute);
    device_.record(*sums_ready_, compute);
    device_.synchronize(*sums_ready_, config_.timeout);
  }
  double total = 0.0;
  for (size_t u = 0; u < units_; ++u) total += per_unit[u];
  return total;
}

double ShardedUpdate::global_sum_of_squares(const GradReducer& grads) {
  memory::Stream& compute = device_.compute_stream();
  const size_t block = layout_.options().block;
  size_t k = 0;
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    const size_t blocks = ownership_.range(b).len / block;
    const GradReducer::Reduced g = grads.reduced(b);
    device_.block_sum_of_squares(g.ptr, g.dtype, block, blocks, block_sums_.as<double>() + k, compute);
    k += blocks;
  }
  const bool gather = !gathered_sums_.empty();
  if (gather) {
    order_.before_issue(compute);
    comm::WorkHandle w = comm_.all_gather(block_sums_.data(), gathered_sums_.data(), owned_blocks_, DType::kFloat64);
    order_.after(*w, compute);
  }
  const memory::Buffer& src = gather ? gathered_sums_ : block_sums_;
  device_.copy(host_sums_.data(), src.data(), host_sums_.size_bytes(), compute);
  // The clip and overflow decisions need the value on the host: the step's one wait on the device.
  device_.record(*sums_ready_, compute);
  device_.synchronize(*sums_ready_, config_.timeout);

  // Add in global order, per unit: bucket-major, then rank (chunk order), then block (the flat
  // order); under tensor parallelism only the blocks this rank counts.
  const double* sums = host_sums_.as<double>();
  const size_t world = gather ? static_cast<size_t>(comm_.size()) : 1;
  double* per_unit = mp_host_.as<double>();
  std::fill(per_unit, per_unit + units_, 0.0);
  size_t base = 0;
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    const size_t blocks = ownership_.range(b).len / block;
    for (size_t q = 0; q < world; ++q) {
      const double* x = sums + q * owned_blocks_ + base;
      const size_t first = (gather ? layout_.chunk_begin(b, static_cast<int>(q)) : ownership_.range(b).flat_begin) / block;
      // Block by block in flat order into its unit's sum, a run at a time (the same additions in the
      // same order as one block at a time: the same bits).
      auto run = std::upper_bound(runs_.begin(), runs_.end(), first,
                                  [](size_t k, const BlockRun& r) { return k < r.end; });
      for (size_t j = 0; j < blocks; ++run) {
        const size_t stop = std::min(blocks, run->end - first);
        if (run->counted) {
          double sum = per_unit[run->unit];
          for (; j < stop; ++j) sum += x[j];
          per_unit[run->unit] = sum;
        }
        j = stop;
      }
    }
    base += blocks;
  }
  return add_over_model_parallel();
}

StepResult ShardedUpdate::step(const GradReducer& grads, float loss_scale, double divisor,
                               optim::DynamicLossScaler* scaler, int64_t steps_taken) {
  fault::point("optimizer_step");
  StepResult r;
  r.loss_scale = loss_scale;
  r.step = steps_taken;
  // The reduced gradients are the update's to finish: the partial parts are summed in place.
  for (const auto& sum : partial_sums_) sum->run([&](size_t b) { return const_cast<void*>(grads.reduced(b).ptr); });
  if (config_.check_copies && !copies_checked_) check_copies(grads);
  const double total = global_sum_of_squares(grads);
  const bool found_inf = !std::isfinite(total);
  // A step that overflowed compared nothing (non-finite values are left out): the next one checks.
  if (!found_inf) copies_checked_ = true;
  const double unscale = 1.0 / (static_cast<double>(loss_scale) * divisor);
  if (scaler != nullptr) {
    if (scaler->update(found_inf)) {
      r.skipped = true;
      r.grad_norm = found_inf ? INFINITY : std::sqrt(total) * unscale;
      ZERO_LOG_INFO("step skipped: inf/NaN gradients at loss scale {}; new scale {}", loss_scale, scaler->scale());
      return r;
    }
  } else if (found_inf) {
    ZERO_THROW(Error, "gradients contain inf or NaN at step {} (no dynamic loss scaling to skip it)",
               steps_taken + 1);
  }
  r.grad_norm = std::sqrt(total) * unscale;
  r.clip_coefficient = optim::clip_coefficient(r.grad_norm, config_.max_grad_norm);
  applier_->apply(grads, static_cast<float>(unscale * r.clip_coefficient), writeback_);
  r.step = steps_taken + 1;
  return r;
}

}  // namespace zero
