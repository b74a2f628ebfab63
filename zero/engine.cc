#include "zero/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/logging.h"
#include "memory/tracker.h"
#include "optim/grad_utils.h"
#include "zero/tensor_ops.h"

namespace zero {

using memory::Category;
using memory::HostBuffer;

// Buffers of one in-flight bucket reduction, allocated on first use and reused.
struct Engine::Slot {
  HostBuffer staging;  // stage 2: the bucket's gradients in the model dtype
  HostBuffer send;     // the bucket in the reduce dtype, when it differs from the model dtype
  HostBuffer recv;     // deterministic mode: every rank's copy of this rank's chunk
};

struct Engine::BucketState {
  size_t pending = 0;  // tensors of the bucket not yet ready this micro-step
  int slot = -1;
  bool ready = false;
  comm::WorkHandle work;
  void* comm_buffer = nullptr;  // what the collective reduces (reduce dtype)
};

Engine::Engine(comm::Communicator& comm, EngineOptions options)
    : comm_(comm), options_(std::move(options)), rank_(comm.rank()), world_(comm.size()) {
  validate(options_);
  if (options_.loss_scaling == LossScaling::kDynamic) scaler_.emplace(options_.dynamic_loss_scaler);
}

Engine::~Engine() {
  // Collectives still in flight write into our buffers: let them finish (or fail) first.
  for (size_t b : inflight_) {
    try {
      buckets_[b].work->wait(options_.timeout);
    } catch (const std::exception& e) {
      ZERO_LOG_WARN("engine destroyed with a failed reduction in flight: {}", e.what());
    }
  }
}

int Engine::add_param(const ParamSpec& spec) {
  if (finalized_) {
    ZERO_THROW(InvalidArgument, "add_param('{}') after finalize(): register every parameter first",
               spec.name);
  }
  return registry_.add(spec);
}

void Engine::require_finalized(const char* what) const {
  if (!finalized_) ZERO_THROW(InvalidArgument, "{}() called before finalize()", what);
}

void Engine::require_param(int id, const char* what) const {
  require_finalized(what);
  const ParamSpec& p = registry_.param(id);
  if (!p.requires_grad) {
    ZERO_THROW(InvalidArgument, "{}({}): parameter '{}' is frozen (requires_grad = false)", what, id,
               p.name);
  }
}

size_t Engine::tensor_of(int id) const { return static_cast<size_t>(param_tensor_.at(static_cast<size_t>(id))); }

// The optimizer updates the whole flat space at stage 0 and the rank's shard above it.
size_t Engine::optimizer_numel() const {
  return options_.stage == 0 ? layout_->padded_numel() : layout_->shard_numel();
}

Engine::OwnedRange Engine::owned(size_t b) const {
  const auto& B = layout_->buckets()[b];
  if (options_.stage == 0) return {B.offset, B.padded, B.offset};
  return {B.shard_offset, B.chunk, B.offset + static_cast<size_t>(rank_) * B.chunk};
}

bool Engine::reduces_now() const { return options_.reduce_every_micro_step; }

// ---------------------------------------------------------------------------------------------
// finalize

void Engine::finalize() {
  if (finalized_) ZERO_THROW(InvalidArgument, "finalize() called twice");
  // Problems that need the options are recorded as local errors, so verification reports them on
  // every rank instead of leaving the others waiting in a collective.
  const int groups = static_cast<int>(options_.optimizer.groups.size());
  std::optional<DType> model_dtype;
  for (const ParamSpec& p : registry_.params()) {
    if (p.group >= groups) {
      registry_.note_error(fmt::format("parameter '{}': group {} but the optimizer has {} group(s)",
                                       p.name, p.group, groups));
    }
    if (!p.requires_grad) continue;
    if (!model_dtype) model_dtype = p.dtype;
    if (p.dtype != *model_dtype) {
      registry_.note_error(fmt::format(
          "parameter '{}' is {} but earlier trainable parameters are {}: all trainable parameters "
          "must share one dtype",
          p.name, dtype_name(p.dtype), dtype_name(*model_dtype)));
    }
  }
  if (!model_dtype) registry_.note_error("no trainable parameters registered");
  if (options_.reduce_dtype != DType::kFloat32 && model_dtype && options_.reduce_dtype != *model_dtype) {
    registry_.note_error(fmt::format("EngineOptions.reduce_dtype {} must be fp32 or the model dtype {}",
                                     dtype_name(options_.reduce_dtype), dtype_name(*model_dtype)));
  }
  if (options_.grad_accum_dtype != DType::kFloat32 && model_dtype &&
      options_.grad_accum_dtype != *model_dtype) {
    registry_.note_error(fmt::format("EngineOptions.grad_accum_dtype {} must be fp32 or the model dtype {}",
                                     dtype_name(options_.grad_accum_dtype), dtype_name(*model_dtype)));
  }
  registry_.verify_across_ranks(comm_, options_.timeout);
  model_dtype_ = *model_dtype;

  // Layout over trainable parameters, in registration order.
  std::vector<size_t> numels;
  param_tensor_.assign(registry_.params().size(), -1);
  for (int id : registry_.trainable()) {
    param_tensor_[static_cast<size_t>(id)] = static_cast<int64_t>(tensor_param_.size());
    tensor_param_.push_back(id);
    numels.push_back(registry_.numel(id));
  }
  layout_ = std::make_unique<ShardLayout>(numels, world_, options_.layout);
  ZERO_LOG_DEBUG("{}", layout_->describe());

  broadcast_initial_values();

  master_ = HostBuffer::for_elements(static_cast<int64_t>(optimizer_numel()), DType::kFloat32,
                                     Category::kMasterParams);
  init_master();
  build_optimizer();

  if (options_.stage < 2) {
    flat_grad_ = HostBuffer::for_elements(static_cast<int64_t>(layout_->padded_numel()), model_dtype_,
                                          Category::kGrads);
  }
  // Stage 2's gradient shard, or (stages 0/1) the fp32 accumulator of gradients reduced every
  // micro-step of an accumulation.
  const bool accumulate = options_.reduce_every_micro_step && options_.gradient_accumulation_steps > 1;
  if (options_.stage == 2 || accumulate) {
    accum_dtype_ = options_.stage == 2 ? options_.grad_accum_dtype : DType::kFloat32;
    accum_ = HostBuffer::for_elements(static_cast<int64_t>(optimizer_numel()), accum_dtype_,
                                      Category::kGrads);
  }
  const int64_t bucket = static_cast<int64_t>(layout_->max_bucket_padded());
  for (auto& g : gather_) g = HostBuffer::for_elements(bucket, model_dtype_, Category::kCommBuffer);

  buckets_.assign(layout_->buckets().size(), BucketState{});
  tensor_ready_.assign(tensor_param_.size(), 0);
  scratch_.resize(tensor_param_.size());
  reset_micro_step_state();
  finalized_ = true;
}

void Engine::broadcast_initial_values() {
  for (const ParamSpec& p : registry_.params()) {
    comm_.broadcast(p.data.ptr, p.data.numel, p.dtype, 0)->wait(options_.timeout);
  }
}

void Engine::init_master() {
  float* master = master_.as<float>();
  if (options_.stage == 0) {
    for (size_t t = 0; t < tensor_param_.size(); ++t) {
      const ParamSpec& p = registry_.param(tensor_param_[t]);
      convert_elements(p.data.ptr, p.dtype, master + layout_->tensors()[t].offset, DType::kFloat32,
                       p.data.numel);
    }
    return;
  }
  for (const ShardLayout::Piece& piece : layout_->pieces(rank_)) {
    const ParamSpec& p = registry_.param(tensor_param_[piece.tensor]);
    convert_elements(element_ptr(p.data.ptr, p.dtype, piece.tensor_begin), p.dtype,
                     master + piece.shard_offset, DType::kFloat32,
                     piece.tensor_end - piece.tensor_begin);
  }
}

void Engine::build_optimizer() {
  std::vector<optim::Segment> segments;
  if (options_.stage == 0) {
    for (size_t t = 0; t < tensor_param_.size(); ++t) {
      const ParamSpec& p = registry_.param(tensor_param_[t]);
      const auto& T = layout_->tensors()[t];
      segments.push_back({T.offset, T.offset + T.numel, p.group, p.name, 0});
    }
  } else {
    for (const ShardLayout::Piece& piece : layout_->pieces(rank_)) {
      const ParamSpec& p = registry_.param(tensor_param_[piece.tensor]);
      segments.push_back({piece.shard_offset, piece.shard_offset + (piece.tensor_end - piece.tensor_begin),
                          p.group, p.name, piece.tensor_begin});
    }
  }
  optimizer_ = std::make_unique<optim::Optimizer>(options_.optimizer, optimizer_numel(), std::move(segments));
}

// ---------------------------------------------------------------------------------------------
// gradients during backward

void Engine::reset_micro_step_state() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& B = layout_->buckets()[b];
    buckets_[b] = BucketState{};
    buckets_[b].pending = B.end_tensor - B.first_tensor;
  }
  std::fill(tensor_ready_.begin(), tensor_ready_.end(), 0);
  next_launch_ = 0;
}

int Engine::acquire_slot() {
  if (free_slots_.empty()) {
    // Bound the buffers in flight: finish the oldest reduction before opening another.
    if (static_cast<int>(slots_.size() - free_slots_.size()) >= options_.max_inflight_buckets &&
        !inflight_.empty()) {
      complete(inflight_.front());
    }
  }
  if (free_slots_.empty()) {
    slots_.push_back(std::make_unique<Slot>());
    return static_cast<int>(slots_.size() - 1);
  }
  const int s = free_slots_.back();
  free_slots_.pop_back();
  return s;
}

void Engine::release_slot(int slot) { free_slots_.push_back(slot); }

void* Engine::bucket_grad_buffer(size_t b) {
  const auto& B = layout_->buckets()[b];
  if (options_.stage < 2) return element_ptr(flat_grad_.data(), model_dtype_, B.offset);
  BucketState& st = buckets_[b];
  if (st.slot < 0) {
    st.slot = acquire_slot();
    Slot& s = *slots_[static_cast<size_t>(st.slot)];
    const size_t bytes = layout_->max_bucket_padded() * dtype_size(model_dtype_);
    if (s.staging.size_bytes() < bytes) s.staging = HostBuffer(bytes, Category::kCommBuffer);
    zero_elements(s.staging.data(), model_dtype_, B.padded);
  }
  return slots_[static_cast<size_t>(st.slot)]->staging.data();
}

void* Engine::grad(int id) {
  require_param(id, "grad");
  const ParamSpec& p = registry_.param(id);
  backward_open_ = true;
  if (p.grad.ptr != nullptr) return p.grad.ptr;
  const size_t t = tensor_of(id);
  if (tensor_ready_[t]) {
    ZERO_THROW(InvalidArgument, "grad({}): parameter '{}' was already marked ready in this micro-step",
               id, p.name);
  }
  const auto& T = layout_->tensors()[t];
  if (options_.stage < 2) return element_ptr(flat_grad_.data(), model_dtype_, T.offset);
  const auto [first, last] = layout_->buckets_of_tensor(t);
  if (first == last) {
    void* staging = bucket_grad_buffer(first);
    return element_ptr(staging, model_dtype_, T.offset - layout_->buckets()[first].offset);
  }
  // A tensor spanning buckets gets a contiguous scratch buffer, copied into the buckets when ready.
  if (scratch_[t].size_bytes() == 0) {
    scratch_[t] = HostBuffer::for_elements(static_cast<int64_t>(T.numel), model_dtype_, Category::kGrads);
  }
  return scratch_[t].data();
}

void Engine::stage_tensor(size_t t) {
  const ParamSpec& p = registry_.param(tensor_param_[t]);
  const auto& T = layout_->tensors()[t];
  const void* src = nullptr;
  if (p.grad.ptr != nullptr) {
    src = p.grad.ptr;
  } else if (options_.stage == 2 && scratch_[t].size_bytes() != 0) {
    src = scratch_[t].data();
  } else {
    return;  // already written in place (flat buffer or staging)
  }
  const auto [first, last] = layout_->buckets_of_tensor(t);
  for (size_t b = first; b <= last; ++b) {
    const auto& B = layout_->buckets()[b];
    const size_t lo = std::max(T.offset, B.offset);
    const size_t hi = std::min(T.offset + T.numel, B.offset + B.numel);
    void* dst = element_ptr(bucket_grad_buffer(b), model_dtype_, lo - B.offset);
    if (options_.stage < 2) {
      // The flat buffer accumulates over no_sync micro-steps; user storage was zeroed after each copy.
      accumulate_elements(dst, model_dtype_, element_ptr(src, model_dtype_, lo - T.offset), model_dtype_,
                          hi - lo);
    } else {
      convert_elements(element_ptr(src, model_dtype_, lo - T.offset), model_dtype_, dst, model_dtype_,
                       hi - lo);
    }
  }
  if (p.grad.ptr != nullptr) {
    zero_elements(p.grad.ptr, model_dtype_, T.numel);
  } else {
    scratch_[t] = HostBuffer();  // release the scratch
  }
}

void Engine::grad_ready(int id) {
  require_param(id, "grad_ready");
  const size_t t = tensor_of(id);
  if (tensor_ready_[t]) {
    ZERO_THROW(InvalidArgument, "grad_ready({}): parameter '{}' was already marked ready in this micro-step",
               id, registry_.param(id).name);
  }
  backward_open_ = true;
  mark_tensor_ready(t);
  launch_ready_buckets();
}

void Engine::mark_tensor_ready(size_t t) {
  tensor_ready_[t] = 1;
  if (!reduces_now()) return;  // no_sync: the user's storage keeps accumulating until the last micro-step
  stage_tensor(t);
  const auto [first, last] = layout_->buckets_of_tensor(t);
  for (size_t b = first; b <= last; ++b) {
    if (--buckets_[b].pending == 0) buckets_[b].ready = true;
  }
}

void Engine::launch_ready_buckets() {
  // Issue order is fixed (last bucket first, as backward produces them), so every rank issues the
  // same sequence of collectives whatever order its grad_ready calls came in.
  const size_t nb = buckets_.size();
  while (next_launch_ < nb) {
    const size_t b = nb - 1 - next_launch_;
    if (!buckets_[b].ready) break;
    launch(b);
    ++next_launch_;
  }
}

void Engine::launch(size_t b) {
  const auto& B = layout_->buckets()[b];
  BucketState& st = buckets_[b];
  const DType rd = options_.reduce_dtype;
  void* grads = bucket_grad_buffer(b);
  const bool convert = rd != model_dtype_;
  if (st.slot < 0 && (convert || options_.deterministic)) st.slot = acquire_slot();
  void* cbuf = grads;
  if (convert) {
    Slot& s = *slots_[static_cast<size_t>(st.slot)];
    const size_t bytes = layout_->max_bucket_padded() * dtype_size(rd);
    if (s.send.size_bytes() < bytes) s.send = HostBuffer(bytes, Category::kCommBuffer);
    convert_elements(grads, model_dtype_, s.send.data(), rd, B.padded);
    cbuf = s.send.data();
  }
  st.comm_buffer = cbuf;
  if (options_.deterministic) {
    Slot& s = *slots_[static_cast<size_t>(st.slot)];
    const size_t bytes = layout_->max_bucket_padded() * dtype_size(rd);
    if (s.recv.size_bytes() < bytes) s.recv = HostBuffer(bytes, Category::kCommBuffer);
    st.work = comm_.all_to_all(cbuf, s.recv.data(), B.chunk, rd);
  } else if (options_.stage == 0) {
    st.work = comm_.all_reduce(cbuf, B.padded, rd, comm::ReduceOp::kSum);
  } else {
    st.work = comm_.reduce_scatter(cbuf, element_ptr(cbuf, rd, static_cast<size_t>(rank_) * B.chunk),
                                   B.chunk, rd, comm::ReduceOp::kSum);
  }
  inflight_.push_back(b);
}

void Engine::complete(size_t b) {
  auto it = std::find(inflight_.begin(), inflight_.end(), b);
  ZERO_CHECK(it != inflight_.end(), "bucket {} is not in flight", b);
  // Collectives complete in issue order: finish the older ones first.
  while (inflight_.front() != b) complete(inflight_.front());
  inflight_.erase(inflight_.begin());

  const auto& B = layout_->buckets()[b];
  BucketState& st = buckets_[b];
  st.work->wait(options_.timeout);
  const DType rd = options_.reduce_dtype;
  void* reduced_chunk = element_ptr(st.comm_buffer, rd, static_cast<size_t>(rank_) * B.chunk);
  if (options_.deterministic) {
    // recv holds every rank's copy of this rank's chunk, in rank order: sum them in that order.
    ordered_sum(slots_[static_cast<size_t>(st.slot)]->recv.data(), rd, B.chunk, world_, reduced_chunk,
                rd, B.chunk);
    if (options_.stage == 0) {
      comm_.all_gather(reduced_chunk, st.comm_buffer, B.chunk, rd)->wait(options_.timeout);
    }
  }
  // Route the reduced gradient (whole bucket at stage 0, this rank's chunk otherwise).
  const OwnedRange own = owned(b);
  const size_t n = own.len;
  const void* reduced = element_ptr(st.comm_buffer, rd, own.flat_begin - B.offset);
  const size_t grad_offset = own.flat_begin;
  if (accum_.size_bytes() != 0) {
    void* acc = element_ptr(accum_.data(), accum_dtype_, own.opt_begin);
    if (accum_has_data_) {
      accumulate_elements(acc, accum_dtype_, reduced, rd, n);
    } else {
      convert_elements(reduced, rd, acc, accum_dtype_, n);
    }
    if (options_.stage < 2) {
      // The flat bucket is consumed: clear it for the next micro-step.
      zero_elements(element_ptr(flat_grad_.data(), model_dtype_, B.offset), model_dtype_, B.padded);
    }
  } else if (rd != model_dtype_) {
    // Reduced in fp32: store the result back in the flat gradient buffer, rounded once.
    convert_elements(reduced, rd, element_ptr(flat_grad_.data(), model_dtype_, grad_offset), model_dtype_,
                     n);
  }
  if (st.slot >= 0) {
    release_slot(st.slot);
    st.slot = -1;
  }
  st.work.reset();
}

void Engine::complete_all() {
  while (!inflight_.empty()) complete(inflight_.front());
}

void Engine::finish_backward() {
  require_finalized("finish_backward");
  if (micro_steps_ >= options_.gradient_accumulation_steps) {
    ZERO_THROW(InvalidArgument,
               "finish_backward(): {} micro-steps since the last step() but "
               "EngineOptions.gradient_accumulation_steps is {}; call step()",
               micro_steps_ + 1, options_.gradient_accumulation_steps);
  }
  const bool last_micro_step = micro_steps_ + 1 == options_.gradient_accumulation_steps;
  if (reduces_now()) {
    // Tensors never marked ready (or without a gradient this micro-step) are reduced now.
    for (size_t t = 0; t < tensor_param_.size(); ++t) {
      if (!tensor_ready_[t]) mark_tensor_ready(t);
    }
    reduce_launched_buckets();
  } else if (last_micro_step) {
    reduce_deferred();
  } else {
    deferred_ = true;
  }
  ++micro_steps_;
  backward_open_ = false;
  reset_micro_step_state();
}

void Engine::reduce_launched_buckets() {
  launch_ready_buckets();
  ZERO_CHECK_EQ(next_launch_, buckets_.size(), "every bucket must be launched at the end of backward");
  complete_all();
  if (accum_.size_bytes() != 0) accum_has_data_ = true;
}

void Engine::reduce_deferred() {
  // no_sync: everything accumulated locally since the last step is reduced once, now.
  for (size_t t = 0; t < tensor_param_.size(); ++t) stage_tensor(t);
  for (BucketState& st : buckets_) st.ready = true;
  reduce_launched_buckets();
  deferred_ = false;
}

void Engine::zero_grad() {
  require_finalized("zero_grad");
  complete_all();
  clear_gradients();
  micro_steps_ = 0;
  backward_open_ = false;
  deferred_ = false;
  reset_micro_step_state();
}

void Engine::clear_gradients() {
  if (flat_grad_.size_bytes() != 0) std::memset(flat_grad_.data(), 0, flat_grad_.size_bytes());
  accum_has_data_ = false;
  for (auto& s : scratch_) s = HostBuffer();
  for (const ParamSpec& p : registry_.params()) {
    if (p.requires_grad && p.grad.ptr != nullptr) zero_elements(p.grad.ptr, p.dtype, p.grad.numel);
  }
}

// ---------------------------------------------------------------------------------------------
// step

DType Engine::grad_source_dtype() const {
  return accum_.size_bytes() != 0 ? accum_dtype_ : model_dtype_;
}

const void* Engine::optimizer_grad(size_t b, DType* dtype) const {
  const OwnedRange own = owned(b);
  *dtype = grad_source_dtype();
  if (accum_.size_bytes() != 0) return element_ptr(accum_.data(), accum_dtype_, own.opt_begin);
  return element_ptr(flat_grad_.data(), model_dtype_, own.flat_begin);
}

double Engine::global_sum_of_squares() {
  // Partial sums per block of the flat space, added in global block order: the same bits at every
  // stage and world size (see ShardLayout). Each rank computes the blocks it owns.
  const size_t block = layout_->options().block;
  const size_t nb = buckets_.size();
  std::vector<double> mine;
  mine.reserve(layout_->shard_numel() / block + 1);
  std::vector<double> all;
  if (options_.stage == 0) {
    all.reserve(layout_->num_blocks());
    for (size_t b = 0; b < nb; ++b) {
      DType dt;
      const void* g = optimizer_grad(b, &dt);
      const size_t blocks = layout_->buckets()[b].padded / block;
      for (size_t k = 0; k < blocks; ++k) {
        all.push_back(optim::sum_of_squares(element_ptr(g, dt, k * block), dt, block));
      }
    }
  } else {
    for (size_t b = 0; b < nb; ++b) {
      DType dt;
      const void* g = optimizer_grad(b, &dt);
      const size_t blocks = layout_->buckets()[b].chunk / block;
      for (size_t k = 0; k < blocks; ++k) {
        mine.push_back(optim::sum_of_squares(element_ptr(g, dt, k * block), dt, block));
      }
    }
    std::vector<double> gathered(mine.size() * static_cast<size_t>(world_));
    comm_.all_gather(mine.data(), gathered.data(), mine.size(), DType::kFloat64)->wait(options_.timeout);
    // Reorder to global order: bucket-major, then rank, then block.
    all.reserve(gathered.size());
    size_t base = 0;
    for (size_t b = 0; b < nb; ++b) {
      const size_t blocks = layout_->buckets()[b].chunk / block;
      for (int q = 0; q < world_; ++q) {
        const double* src = gathered.data() + static_cast<size_t>(q) * mine.size() + base;
        all.insert(all.end(), src, src + blocks);
      }
      base += blocks;
    }
  }
  double total = 0.0;
  for (double x : all) total += x;
  return total;
}

StepResult Engine::step() {
  require_finalized("step");
  if (backward_open_ || micro_steps_ == 0) finish_backward();
  if (deferred_) {
    // no_sync with fewer micro-steps than configured: reduce what was accumulated.
    reduce_deferred();
    reset_micro_step_state();
  }
  StepResult r;
  r.micro_steps = micro_steps_;
  r.loss_scale = loss_scale();

  const double total = global_sum_of_squares();
  const bool found_inf = !std::isfinite(total);
  // Reduction summed world * micro-step contributions; the loss carried the loss scale.
  const double unscale = 1.0 / (static_cast<double>(r.loss_scale) * world_ * micro_steps_);
  if (scaler_) {
    if (scaler_->update(found_inf)) {
      r.skipped = true;
      r.grad_norm = found_inf ? INFINITY : std::sqrt(total) * unscale;
      clear_gradients();
      micro_steps_ = 0;
      r.step = steps_taken_;
      ZERO_LOG_INFO("step skipped: inf/NaN gradients at loss scale {}; new scale {}", r.loss_scale,
                    scaler_->scale());
      return r;
    }
  } else if (found_inf) {
    clear_gradients();
    micro_steps_ = 0;
    ZERO_THROW(Error, "gradients contain inf or NaN at step {} (no dynamic loss scaling to skip it)",
               steps_taken_ + 1);
  }
  r.grad_norm = std::sqrt(total) * unscale;
  if (options_.max_grad_norm > 0.0f) {
    // torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1.
    const double coef = static_cast<double>(options_.max_grad_norm) / (r.grad_norm + 1e-6);
    r.clip_coefficient = static_cast<float>(std::min(1.0, coef));
  }
  update_and_gather(static_cast<float>(unscale * r.clip_coefficient));
  clear_gradients();
  micro_steps_ = 0;
  r.step = ++steps_taken_;
  return r;
}

void Engine::update_and_gather(float grad_scale) {
  optimizer_->begin_step();
  float* master = master_.as<float>();
  const size_t nb = buckets_.size();
  std::array<comm::WorkHandle, 2> pending;
  std::array<size_t, 2> pending_bucket{};
  auto drain = [&](int s) {
    if (!pending[s]) return;
    pending[s]->wait(options_.timeout);
    pending[s].reset();
    scatter_bucket_to_params(pending_bucket[s], gather_[s].data());
  };
  for (size_t b = 0; b < nb; ++b) {
    const int s = static_cast<int>(b % 2);
    drain(s);  // the buffer's previous bucket must reach the parameters before reuse
    const auto& B = layout_->buckets()[b];
    const OwnedRange own = owned(b);
    optim::StepInput in;
    in.master = master + own.opt_begin;
    in.grad = optimizer_grad(b, &in.grad_dtype);
    in.grad_scale = grad_scale;
    in.model_out = element_ptr(gather_[s].data(), model_dtype_, own.flat_begin - B.offset);
    in.model_dtype = model_dtype_;
    optimizer_->step_range(in, own.opt_begin, own.opt_begin + own.len);
    if (options_.stage == 0) {
      scatter_bucket_to_params(b, gather_[s].data());
    } else {
      pending[s] = comm_.all_gather(in.model_out, gather_[s].data(), B.chunk, model_dtype_);
      pending_bucket[s] = b;
    }
  }
  drain(0);
  drain(1);
}

void Engine::scatter_bucket_to_params(size_t b, const void* bucket_params) {
  const auto& B = layout_->buckets()[b];
  for (size_t t = B.first_tensor; t < B.end_tensor; ++t) {
    const auto& T = layout_->tensors()[t];
    const size_t lo = std::max(T.offset, B.offset);
    const size_t hi = std::min(T.offset + T.numel, B.offset + B.numel);
    const ParamSpec& p = registry_.param(tensor_param_[t]);
    std::memcpy(element_ptr(p.data.ptr, model_dtype_, lo - T.offset),
                element_ptr(bucket_params, model_dtype_, lo - B.offset), (hi - lo) * dtype_size(model_dtype_));
  }
}

// ---------------------------------------------------------------------------------------------
// misc

GatherScope Engine::gather(int unit) {
  require_finalized("gather");
  (void)unit;
  return GatherScope{};
}

GatherScope Engine::gather_for_backward(int unit) {
  require_finalized("gather_for_backward");
  (void)unit;
  return GatherScope{};
}

float Engine::loss_scale() const {
  switch (options_.loss_scaling) {
    case LossScaling::kNone: return 1.0f;
    case LossScaling::kStatic: return options_.static_loss_scale;
    case LossScaling::kDynamic: return scaler_->scale();
  }
  return 1.0f;
}

optim::Optimizer& Engine::optimizer() {
  require_finalized("optimizer");
  return *optimizer_;
}

const ShardLayout& Engine::layout() const {
  require_finalized("layout");
  return *layout_;
}

MemoryReport Engine::memory_report() const {
  require_finalized("memory_report");
  const auto& tracker = memory::MemoryTracker::global();
  MemoryFormulaInputs in;
  in.stage = options_.stage;
  in.world_size = world_;
  for (int id : registry_.trainable()) in.numel += registry_.numel(id);
  in.param_bytes = dtype_size(model_dtype_);
  in.grad_bytes = dtype_size(model_dtype_);
  in.shard_grad_bytes = options_.stage == 2 ? dtype_size(accum_dtype_) : 4;
  in.accumulator = options_.stage < 2 && accum_.size_bytes() != 0;
  in.state_bytes = optimizer_->state_names().size() * dtype_size(optimizer_->state_dtype());
  const MemoryPrediction pred = predict_memory(in);

  MemoryReport rep;
  rep.rank = rank_;
  rep.stage = options_.stage;
  rep.world_size = world_;
  rep.numel = in.numel;
  rep.formula = pred.formula;
  // Parameters are the user's storage: their registered size is what is resident.
  uint64_t param_bytes = 0;
  for (const ParamSpec& p : registry_.params()) param_bytes += p.data.numel * dtype_size(p.dtype);
  rep.rows.push_back({"params (user)", param_bytes, param_bytes, pred.params, true});
  auto row = [&](Category c, uint64_t predicted, bool in_formula) {
    const auto u = tracker.usage(c);
    rep.rows.push_back({memory::category_name(c), u.current, u.peak, predicted, in_formula});
  };
  row(Category::kGrads, pred.grads, true);
  row(Category::kMasterParams, pred.master, true);
  row(Category::kOptimizerState, pred.optimizer_state, true);
  row(Category::kCommBuffer, 0, false);
  row(Category::kGatherWindow, 0, false);
  return rep;
}

}  // namespace zero
