#include "zero/grad_reducer.h"

#include <algorithm>

#include "base/fault_injection.h"
#include "base/check.h"
#include "base/logging.h"

namespace zero {

using memory::Buffer;
using memory::Category;

namespace {

void* at(void* base, DType dtype, size_t i) { return static_cast<char*>(base) + i * dtype_size(dtype); }
const void* at(const void* base, DType dtype, size_t i) {
  return static_cast<const char*>(base) + i * dtype_size(dtype);
}

}  // namespace

// Buffers of one in-flight bucket reduction, allocated on first use and reused. `released` marks the
// reduce stream's last use, so the compute stream never refills a slot still being read.
struct GradReducer::Slot {
  Buffer staging;  // the bucket's gradients in the model dtype (when there is no full buffer)
  Buffer send;     // the bucket in the reduce dtype, when that differs from the model dtype
  Buffer recv;     // deterministic mode: every rank's copy of this rank's chunk
  std::unique_ptr<memory::Event> released;
};

struct GradReducer::BucketState {
  size_t pending = 0;  // tensors of the bucket not yet complete this micro-step
  bool ready = false;
  int slot = -1;
  bool from_full = false;       // the bucket is reduced out of the full buffer
  void* comm_buffer = nullptr;  // what the collective reduces (reduce dtype)
  comm::WorkHandle work;
};

GradReducer::GradReducer(const ReducerConfig& config, const ShardLayout& layout,
                         const ShardOwnership& ownership, ReducerComms comms, memory::Device& device,
                         std::vector<UserGrad> user_grads)
    : config_(config), layout_(layout), ownership_(ownership), comms_(comms), device_(device),
      stream_(device.create_stream("reduce")), event_(device.create_event()),
      shard_order_(device, *comms.shard, config.timeout), user_grads_(std::move(user_grads)) {
  ZERO_CHECK(config_.full_grads || config_.accumulate, "reduced gradients need a home");
  ZERO_CHECK_EQ(user_grads_.size(), layout_.tensors().size());
  if (comms_.replica != nullptr) {
    replica_order_ = std::make_unique<CollectiveOrder>(device, *comms_.replica, config.timeout);
  }
  if (config_.full_grads) ensure_full();
  if (config_.accumulate) {
    accum_ = device_.allocate_elements(static_cast<int64_t>(ownership_.numel()), config_.accum_dtype,
                                       Category::kGrads);
  }
  buckets_.resize(layout_.buckets().size());
  ready_.assign(layout_.tensors().size(), 0);
  scratch_.resize(layout_.tensors().size());
  reset_buckets();
}

GradReducer::~GradReducer() {
  // Collectives still in flight write into our buffers: let them finish (or fail) first. After one
  // failure the rest fail for the same reason: one warning says so.
  size_t failed = 0;
  std::string first;
  for (size_t b : inflight_) {
    try {
      buckets_[b].work->wait(config_.timeout);
    } catch (const std::exception& e) {
      if (failed++ == 0) first = e.what();
    }
  }
  if (failed > 0) {
    ZERO_LOG_WARN("engine destroyed with {} failed gradient reduction(s) in flight; the first: {}", failed, first);
  }
  try {
    device_.synchronize(*stream_, config_.timeout);
  } catch (const std::exception& e) {
    ZERO_LOG_WARN("engine destroyed while its reduce stream failed: {}", e.what());
  }
}

void GradReducer::ensure_full() {
  if (!full_.empty()) return;
  full_ = device_.allocate_elements(static_cast<int64_t>(layout_.padded_numel()), config_.model_dtype,
                                    Category::kGrads);
}

void GradReducer::reset_buckets() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& B = layout_.buckets()[b];
    buckets_[b] = BucketState{};
    buckets_[b].pending = B.end_tensor - B.first_tensor;
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  launched_ = 0;
}

void GradReducer::begin_micro_step(bool sync) {
  if (open_) return;
  open_ = true;
  sync_ = sync;
  if (!sync_) ensure_full();  // no-sync micro-steps accumulate the whole gradient locally
}

int GradReducer::acquire_slot() {
  // Bound the buffers in flight: finish the oldest reduction before opening another.
  if (free_slots_.empty() && static_cast<int>(slots_.size()) >= config_.max_inflight && !inflight_.empty()) {
    complete(inflight_.front());
  }
  if (free_slots_.empty()) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->released = device_.create_event();
    return static_cast<int>(slots_.size() - 1);
  }
  const int s = free_slots_.back();
  free_slots_.pop_back();
  return s;
}

void* GradReducer::bucket_buffer(size_t b) {
  const auto& B = layout_.buckets()[b];
  BucketState& st = buckets_[b];
  if (uses_full()) {
    st.from_full = true;
    return at(full_.data(), config_.model_dtype, B.offset);
  }
  if (st.slot < 0) {
    st.slot = acquire_slot();
    Slot& s = slot(st.slot);
    const size_t bytes = layout_.max_bucket_padded() * dtype_size(config_.model_dtype);
    if (s.staging.size_bytes() < bytes) s.staging = device_.allocate(bytes, Category::kCommBuffer);
    memory::Stream& compute = device_.compute_stream();
    device_.wait(compute, *s.released);
    device_.fill_zero(s.staging.data(), B.padded * dtype_size(config_.model_dtype), compute);
  }
  return slot(st.slot).staging.data();
}

void* GradReducer::grad(size_t t) {
  ZERO_CHECK(open_, "grad() outside a micro-step");
  const auto& T = layout_.tensors()[t];
  if (uses_full()) return at(full_.data(), config_.model_dtype, T.offset);
  const auto [first, last] = layout_.buckets_of_tensor(t);
  if (first == last) return at(bucket_buffer(first), config_.model_dtype, T.offset - layout_.buckets()[first].offset);
  // A tensor spanning buckets gets a contiguous scratch buffer, copied into the buckets when ready.
  if (scratch_[t].empty()) {
    scratch_[t] = device_.allocate_elements(static_cast<int64_t>(T.numel), config_.model_dtype, Category::kGrads);
  }
  return scratch_[t].data();
}

void GradReducer::stage_tensor(size_t t) {
  const auto& T = layout_.tensors()[t];
  const DType dt = config_.model_dtype;
  const bool full = uses_full();
  const void* src = user_grads_[t].ptr;
  if (src == nullptr && !full && !scratch_[t].empty()) src = scratch_[t].data();
  if (src == nullptr) return;  // written in place
  memory::Stream& compute = device_.compute_stream();
  if (full) {
    // The full buffer may hold earlier micro-steps: add to it.
    device_.accumulate(at(full_.data(), dt, T.offset), dt, src, dt, T.numel, compute);
  } else {
    const auto [first, last] = layout_.buckets_of_tensor(t);
    for (size_t b = first; b <= last; ++b) {
      const auto& B = layout_.buckets()[b];
      const size_t lo = std::max(T.offset, B.offset), hi = std::min(T.offset + T.numel, B.offset + B.numel);
      device_.copy(at(bucket_buffer(b), dt, lo - B.offset), at(src, dt, lo - T.offset), (hi - lo) * dtype_size(dt),
                   compute);
    }
  }
  if (user_grads_[t].ptr != nullptr) {
    device_.fill_zero(user_grads_[t].ptr, T.numel * dtype_size(dt), compute);
  } else {
    scratch_[t] = Buffer();  // the compute stream is done with it; host devices free at once
  }
}

void GradReducer::tensor_ready(size_t t) {
  ZERO_CHECK(open_, "tensor_ready() outside a micro-step");
  ZERO_CHECK(!ready_[t], "tensor {} marked ready twice", t);
  ready_[t] = 1;
  stage_tensor(t);
  if (!sync_) return;
  const auto [first, last] = layout_.buckets_of_tensor(t);
  for (size_t b = first; b <= last; ++b) {
    if (--buckets_[b].pending == 0) buckets_[b].ready = true;
  }
  launch_ready();
}

void GradReducer::launch_ready() {
  const size_t nb = buckets_.size();
  while (launched_ < nb && buckets_[nb - 1 - launched_].ready) {
    launch(nb - 1 - launched_);
    ++launched_;
  }
}

void GradReducer::launch(size_t b) {
  fault::point("reduce_scatter");
  const auto& B = layout_.buckets()[b];
  BucketState& st = buckets_[b];
  const DType rd = config_.reduce_dtype;
  void* grads = bucket_buffer(b);
  const bool convert = rd != config_.model_dtype;
  if (st.slot < 0 && (convert || config_.deterministic)) st.slot = acquire_slot();
  // The reduce stream picks the bucket up once backward's writes to it are done.
  device_.record(*event_, device_.compute_stream());
  device_.wait(*stream_, *event_);
  const size_t bucket_bytes = layout_.max_bucket_padded() * dtype_size(rd);
  void* cbuf = grads;
  if (convert) {
    Slot& s = slot(st.slot);
    if (s.send.size_bytes() < bucket_bytes) s.send = device_.allocate(bucket_bytes, Category::kCommBuffer);
    device_.convert(grads, config_.model_dtype, s.send.data(), rd, B.padded, *stream_);
    cbuf = s.send.data();
  }
  st.comm_buffer = cbuf;
  comm::Communicator& comm = shard_order_.comm();
  shard_order_.before_issue(*stream_);
  // Named for the schedule check, so a rank whose reduction meets another rank's different call is
  // told which gradients it was reducing.
  comm::CallLabel label(comm, B.unit >= 0 ? fmt::format("unit {} gradients", B.unit) : fmt::format("bucket {} gradients", b));
  if (config_.deterministic) {
    Slot& s = slot(st.slot);
    const size_t replicas = comms_.replica ? static_cast<size_t>(comms_.replica->size()) : 1;
    if (s.recv.size_bytes() < bucket_bytes * replicas) {
      s.recv = device_.allocate(bucket_bytes * replicas, Category::kCommBuffer);
    }
    // With replicas, this replica's copies go to its place in the replica all-gather (in place).
    const size_t mine = comms_.replica ? static_cast<size_t>(comms_.replica->rank()) * comm.size() * B.chunk : 0;
    st.work = comm.all_to_all(cbuf, at(s.recv.data(), rd, mine), B.chunk, rd);
  } else if (ownership_.is_replicated()) {
    st.work = comm.all_reduce(cbuf, B.padded, rd, comm::ReduceOp::kSum);
  } else {
    st.work = comm.reduce_scatter(cbuf, at(cbuf, rd, static_cast<size_t>(comm.rank()) * B.chunk), B.chunk, rd,
                                  comm::ReduceOp::kSum);
  }
  inflight_.push_back(b);
}

void GradReducer::complete(size_t b) {
  ZERO_CHECK(std::find(inflight_.begin(), inflight_.end(), b) != inflight_.end(), "bucket {} is not in flight", b);
  // Collectives complete in issue order: finish the older ones first.
  while (inflight_.front() != b) complete(inflight_.front());
  inflight_.erase(inflight_.begin());

  const auto& B = layout_.buckets()[b];
  BucketState& st = buckets_[b];
  const DType rd = config_.reduce_dtype;
  comm::Communicator& comm = shard_order_.comm();
  void* chunk = at(st.comm_buffer, rd, static_cast<size_t>(comm.rank()) * B.chunk);
  ScopedTimer waiting(config_.timings ? &config_.timings->reduce_wait_s : nullptr);
  if (config_.timings) config_.timings->reduced_bytes += B.padded * dtype_size(rd);
  shard_order_.after(*st.work, *stream_);
  if (config_.deterministic) {
    // recv holds every rank's copy of this rank's chunk; with replicas, gathered replica by replica,
    // which is global rank order. Sum them in that order.
    Slot& s = slot(st.slot);
    int k = comm.size();
    if (comms_.replica != nullptr) {
      const size_t count = static_cast<size_t>(comm.size()) * B.chunk;
      const void* mine = at(s.recv.data(), rd, static_cast<size_t>(comms_.replica->rank()) * count);
      replica_order_->before_issue(*stream_);
      comm::WorkHandle w = comms_.replica->all_gather(mine, s.recv.data(), count, rd);
      replica_order_->after(*w, *stream_);
      k *= comms_.replica->size();
    }
    device_.ordered_sum(s.recv.data(), rd, B.chunk, k, chunk, rd, B.chunk, *stream_);
    if (ownership_.is_replicated()) {
      shard_order_.before_issue(*stream_);
      comm::WorkHandle w = comm.all_gather(chunk, st.comm_buffer, B.chunk, rd);
      shard_order_.after(*w, *stream_);
    }
  } else if (comms_.replica != nullptr) {
    replica_order_->before_issue(*stream_);
    comm::WorkHandle w = comms_.replica->all_reduce(chunk, B.chunk, rd, comm::ReduceOp::kSum);
    replica_order_->after(*w, *stream_);
  }
  // Route the owned part of the reduced bucket.
  const OwnedRange own = ownership_.range(b);
  const void* reduced = at(st.comm_buffer, rd, own.flat_begin - B.offset);
  if (config_.accumulate) {
    void* acc = at(accum_.data(), config_.accum_dtype, own.opt_begin);
    if (accum_has_data_) {
      device_.accumulate(acc, config_.accum_dtype, reduced, rd, own.len, *stream_);
    } else {
      device_.convert(reduced, rd, acc, config_.accum_dtype, own.len, *stream_);
    }
    // The bucket's gradients are consumed: clear them for the next micro-step.
    if (st.from_full) {
      device_.fill_zero(at(full_.data(), config_.model_dtype, B.offset), B.padded * dtype_size(config_.model_dtype),
                        *stream_);
    }
  } else if (rd != config_.model_dtype) {
    // Reduced in another dtype: store the result back in the full buffer, rounded once.
    device_.convert(reduced, rd, at(full_.data(), config_.model_dtype, own.flat_begin), config_.model_dtype,
                    own.len, *stream_);
  }
  if (st.slot >= 0) {
    device_.record(*slot(st.slot).released, *stream_);
    free_slots_.push_back(st.slot);
    st.slot = -1;
  }
  st.work.reset();
}

void GradReducer::complete_all() {
  while (!inflight_.empty()) complete(inflight_.front());
}

void GradReducer::end_micro_step() {
  if (!open_) begin_micro_step(sync_);
  if (sync_) {
    // Tensors never marked ready (or without a gradient this micro-step) are reduced now.
    for (size_t t = 0; t < ready_.size(); ++t) {
      if (!ready_[t]) tensor_ready(t);
    }
    ZERO_CHECK_EQ(launched_, buckets_.size(), "every bucket must be launched at the end of backward");
    complete_all();
    if (config_.accumulate) accum_has_data_ = true;
    unreduced_ = false;
    // The optimizer and the next backward (on the compute stream) read and write what the reduce
    // stream wrote last.
    device_.record(*event_, *stream_);
    device_.wait(device_.compute_stream(), *event_);
  } else {
    for (size_t t = 0; t < ready_.size(); ++t) {
      if (!ready_[t]) {
        ready_[t] = 1;
        stage_tensor(t);
      }
    }
    unreduced_ = true;
  }
  open_ = false;
  reset_buckets();
}

GradReducer::Reduced GradReducer::reduced(size_t b) const {
  const OwnedRange own = ownership_.range(b);
  if (config_.accumulate) return {at(accum_.data(), config_.accum_dtype, own.opt_begin), config_.accum_dtype};
  return {at(full_.data(), config_.model_dtype, own.flat_begin), config_.model_dtype};
}

void GradReducer::clear() {
  ZERO_CHECK(inflight_.empty(), "clear() with reductions in flight");
  memory::Stream& compute = device_.compute_stream();
  if (!full_.empty()) device_.fill_zero(full_.data(), full_.size_bytes(), compute);
  accum_has_data_ = false;
  unreduced_ = false;
  for (auto& s : scratch_) s = Buffer();
  const DType dt = config_.model_dtype;
  for (size_t t = 0; t < user_grads_.size(); ++t) {
    if (user_grads_[t].ptr) device_.fill_zero(user_grads_[t].ptr, layout_.tensors()[t].numel * dtype_size(dt), compute);
  }
  open_ = false;
  reset_buckets();
}

}  // namespace zero
