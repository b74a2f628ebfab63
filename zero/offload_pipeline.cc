#include "zero/offload_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "base/check.h"
#include "base/logging.h"
#include "memory/meta_device.h"

namespace zero {
OffloadPipeline::OffloadPipeline(const ApplierInputs& in, const OffloadConfig& config)
    : layout_(*in.layout), ownership_(*in.ownership), device_(*in.device),
      config_(config) {
  ZERO_CHECK(config_.host_tracker != nullptr, "the offload tier needs its memory tracker");
  // Planning on a meta device plans the host tier too.
  const bool planning = dynamic_cast<memory::MetaDevice*>(&device_) != nullptr;
  if (planning) {
    host_ = memory::make_meta_device(*config_.host_tracker);
  } else {
    host_ = memory::make_host_device(*config_.host_tracker);
  }
  const size_t numel = ownership_.numel();
  master_ = host_->allocate_elements(static_cast<int64_t>(numel), DType::kFloat32, memory::Category::kMasterParams);
  // The padding between the owned pieces stays zero (as DeviceApplier's, zero/update_applier.cc).
  host_->fill_zero(master_.data(), master_.size_bytes(), host_->compute_stream());
  padding_.resize(layout_.buckets().size());
  {
    std::vector<std::vector<std::pair<size_t, size_t>>> held(layout_.buckets().size());  // (begin, end), optimizer space
    for (const OwnedPiece& p : ownership_.pieces()) held[p.bucket].push_back({p.opt_offset, p.opt_offset + p.tensor_end - p.tensor_begin});
    for (size_t b = 0; b < held.size(); ++b) {
      const OwnedRange own = ownership_.range(b);
      std::sort(held[b].begin(), held[b].end());
      size_t at = own.opt_begin;
      for (const auto& [lo, hi] : held[b]) {
        if (lo > at) padding_[b].push_back({at - own.opt_begin, lo - at});
        at = std::max(at, hi);
      }
      if (own.opt_begin + own.len > at) padding_[b].push_back({at - own.opt_begin, own.opt_begin + own.len - at});
    }
  }
  {
    // The registered values are device memory: bring the owned pieces over once (each element in
    // a slot as wide as the widest registered dtype), then widen.
    size_t es = 1;
    for (const UpdateTensor& t : in.tensors) es = std::max(es, dtype_size(t.dtype));
    memory::Buffer initial = device_.allocate_host_staging(numel * es, memory::Category::kOffloadHost, *config_.host_tracker);
    memory::Stream& compute = device_.compute_stream();
    for (const OwnedPiece& p : ownership_.pieces()) {
      const UpdateTensor& t = in.tensors[p.tensor];
      device_.copy(initial.as<char>() + p.opt_offset * es,
                   static_cast<const char*>(t.data) + p.tensor_begin * dtype_size(t.dtype),
                   (p.tensor_end - p.tensor_begin) * dtype_size(t.dtype), compute);
    }
    device_.synchronize(compute, config_.timeout);
    for (const OwnedPiece& p : ownership_.pieces()) {
      host_->convert(initial.as<char>() + p.opt_offset * es, in.tensors[p.tensor].dtype,
                     master_.as<float>() + p.opt_offset, DType::kFloat32, p.tensor_end - p.tensor_begin,
                     host_->compute_stream());
    }
  }
  // optimizer.num_threads threads, the caller's included, as for the CPU optimizer without offload.
  exchanges_ = make_optimizer_exchanges(in, *host_);
  optimizer_ = make_shard_optimizer(*host_, in.optimizer, numel,
                                    optimizer_segments(ownership_, in.tensors, in.optimizer), config_.timeout,
                                    exchanges_.view());

  size_t most = 0, most_bytes = 0;  // the largest owned range, in elements and in its bucket's dtype
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    most = std::max(most, ownership_.range(b).len);
    most_bytes = std::max(most_bytes, ownership_.range(b).len * dtype_size(layout_.buckets()[b].dtype));
  }
  // Gradient shards arrive in the reduce dtype, at most fp32 wide.
  const size_t grad_bytes = most * sizeof(float);
  for (Slot& s : slots_) {
    const auto cat = memory::Category::kOffloadHost;
    memory::MemoryTracker& tier = *config_.host_tracker;
    s.grad = config_.pinned_staging ? device_.allocate_host_staging(grad_bytes, cat, tier) : host_->allocate(grad_bytes, cat);
    s.params = config_.pinned_staging ? device_.allocate_host_staging(most_bytes, cat, tier) : host_->allocate(most_bytes, cat);
    s.grad_landed = device_.create_event();
    s.params_sent = device_.create_event();
  }
  d2h_ = device_.create_stream("offload d2h");
  h2d_ = device_.create_stream("offload h2d");
  grads_ready_ = device_.create_event();
  out_free_ = device_.create_event();
}

OffloadPipeline::~OffloadPipeline() {
  // Copies still queued read or write the staging: let them drain first.
  for (memory::Stream* s : {d2h_.get(), h2d_.get()}) {
    try {
      if (s) device_.synchronize(*s, config_.timeout);
    } catch (const std::exception& e) {
      ZERO_LOG_WARN("offload pipeline destroyed with a failed copy in flight: {}", e.what());
    }
  }
}

void OffloadPipeline::time_on(memory::Stream& stream, double* total, std::function<void()> work) {
  if (config_.timings == nullptr) {
    work();
    return;
  }
  auto started = std::make_shared<std::chrono::steady_clock::time_point>();
  device_.host_task(stream, [started] { *started = std::chrono::steady_clock::now(); });
  work();
  device_.host_task(stream, [started, total] {
    *total += std::chrono::duration<double>(std::chrono::steady_clock::now() - *started).count();
  });
}

void OffloadPipeline::copy_grad_in(const GradReducer& grads, size_t b, Slot& slot) {
  const GradReducer::Reduced g = grads.reduced(b);
  const size_t bytes = ownership_.range(b).len * dtype_size(g.dtype);
  time_on(*d2h_, &d2h_s_, [&] { device_.copy(slot.grad.data(), g.ptr, bytes, *d2h_); });
  device_.record(*slot.grad_landed, *d2h_);
}

void OffloadPipeline::wait(const memory::Event& e) {
  ScopedTimer waiting(config_.timings ? &config_.timings->offload_wait_s : nullptr);
  device_.synchronize(e, config_.timeout);
}

void OffloadPipeline::apply(const GradReducer& grads, float grad_scale, ParamWriteback& writeback) {
  const size_t n = layout_.buckets().size();
  memory::Stream& compute = device_.compute_stream();
  optimizer_->begin_step();
  d2h_s_ = h2d_s_ = 0;
  // The reduced gradients are complete in compute-stream order.
  device_.record(*grads_ready_, compute);
  device_.wait(*d2h_, *grads_ready_);
  double cpu_s = 0;
  prepare(grads, grad_scale, cpu_s);
  if (n > 0) copy_grad_in(grads, 0, slots_[0]);
  for (size_t b = 0; b < n; ++b) {
    Slot& slot = slots_[b % 2];
    // The other slot's gradient staging was consumed by bucket b-1's update: fill it with b+1's.
    if (b + 1 < n) copy_grad_in(grads, b + 1, slots_[(b + 1) % 2]);
    wait(*slot.grad_landed);
    if (slot.sending) wait(*slot.params_sent);  // bucket b-2's new values have left this staging
    slot.sending = false;
    const OwnedRange own = ownership_.range(b);
    const GradReducer::Reduced g = grads.reduced(b);
    optim::StepInput in;
    in.master = master_.as<float>() + own.opt_begin;
    in.grad = slot.grad.data();
    in.grad_dtype = g.dtype;
    in.grad_scale = grad_scale;
    in.model_out = slot.params.data();
    in.model_dtype = layout_.buckets()[b].dtype;
    {
      ScopedTimer updating(&cpu_s);
      optimizer_->step_range(in, own.opt_begin, own.opt_begin + own.len, host_->compute_stream());
    }
    // The padding goes back as zeros (the staging last held bucket b-2's values there): quantized
    // gathers scale each block by its largest value, padding included.
    for (const auto& [at, len] : padding_[b]) {
      std::memset(slot.params.as<char>() + at * dtype_size(in.model_dtype), 0, len * dtype_size(in.model_dtype));
    }
    // The writeback's range is free once the compute stream reaches this point.
    void* dst = writeback.owned_out(b, own);
    device_.record(*out_free_, compute);
    device_.wait(*h2d_, *out_free_);
    const size_t bytes = own.len * dtype_size(in.model_dtype);
    time_on(*h2d_, &h2d_s_, [&] { device_.copy(dst, slot.params.data(), bytes, *h2d_); });
    device_.record(*slot.params_sent, *h2d_);
    slot.sending = true;
    device_.wait(compute, *slot.params_sent);
    writeback.publish(b);
  }
  writeback.finish();
  // Both copy streams are drained before the step returns (their stopwatches are read next).
  for (Slot& s : slots_) {
    if (s.sending) wait(*s.params_sent);
    s.sending = false;
  }
  device_.synchronize(*d2h_, config_.timeout);
  if (config_.timings) {
    config_.timings->offload_cpu_s += cpu_s;
    config_.timings->offload_d2h_s += d2h_s_;
    config_.timings->offload_h2d_s += h2d_s_;
  }
}

// The optimizer's first pass (ShardOptimizer::prepares): the gradients of the buckets it asks for
// through the staging slots, one copy ahead, before the update's pass copies them again.
void OffloadPipeline::prepare(const GradReducer& grads, float grad_scale, double& cpu_s) {
  std::vector<size_t> wanted;
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    if (optimizer_->prepares(ownership_.range(b).opt_begin)) wanted.push_back(b);
  }
  if (!wanted.empty()) copy_grad_in(grads, wanted[0], slots_[0]);
  for (size_t i = 0; i < wanted.size(); ++i) {
    const size_t b = wanted[i];
    Slot& slot = slots_[i % 2];
    if (i + 1 < wanted.size()) copy_grad_in(grads, wanted[i + 1], slots_[(i + 1) % 2]);
    wait(*slot.grad_landed);
    const OwnedRange own = ownership_.range(b);
    optim::StepInput in;
    in.master = master_.as<float>() + own.opt_begin;
    in.grad = slot.grad.data();
    in.grad_dtype = grads.reduced(b).dtype;
    in.grad_scale = grad_scale;
    in.model_dtype = layout_.buckets()[b].dtype;
    ScopedTimer updating(&cpu_s);
    optimizer_->prepare_range(in, own.opt_begin, own.opt_begin + own.len);
  }
}

void OffloadPipeline::read_master(size_t begin, size_t n, float* out) {
  std::memcpy(out, master_.as<float>() + begin, n * sizeof(float));
}

void OffloadPipeline::write_master(size_t begin, size_t n, const float* in) {
  std::memcpy(master_.as<float>() + begin, in, n * sizeof(float));
}

void OffloadPipeline::publish_master(ParamWriteback& writeback) {
  memory::Stream& compute = device_.compute_stream();
  Slot& slot = slots_[0];
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    const OwnedRange own = ownership_.range(b);
    const DType dt = layout_.buckets()[b].dtype;
    host_->convert(master_.as<float>() + own.opt_begin, DType::kFloat32, slot.params.data(), dt, own.len,
                   host_->compute_stream());
    device_.copy(writeback.owned_out(b, own), slot.params.data(), own.len * dtype_size(dt), compute);
    device_.synchronize(compute, config_.timeout);  // the staging is reused by the next bucket
    writeback.publish(b);
  }
  writeback.finish();
}

}  // namespace zero
