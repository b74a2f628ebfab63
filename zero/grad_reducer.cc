#include "zero/grad_reducer.h"

#include <algorithm>

#include "base/fault_injection.h"
#include "base/check.h"
#include "base/logging.h"
#include "base/splitmix64.h"

namespace zero {

using memory::Buffer;
using memory::Category;

namespace {

void* at(void* base, DType dtype, size_t i) { return static_cast<char*>(base) + i * dtype_size(dtype); }
const void* at(const void* base, DType dtype, size_t i) {
  return static_cast<const char*>(base) + i * dtype_size(dtype);
}

}  // namespace

// Buffers of one in-flight bucket reduction, each exactly its size, from the cache (which orders
// their reuse after the reduce stream's last work on them) and back to it when the bucket completes.
struct GradReducer::Slot {
  Buffer staging;  // the bucket's gradients in its dtype (when there is no full buffer)
  Buffer send;     // the bucket (or a piece) in the reduce dtype, when that differs or pieces are cut
  Buffer recv;     // deterministic mode: every rank's copy of this rank's chunk (or piece)
  // qgZ: the quantized rows sent and received (both hops), the dequantized rows, the node's sums
  Buffer qsend, qrecv, rows, partial;
};

struct GradReducer::BucketState {
  size_t pending = 0;  // tensors of the bucket not yet complete this micro-step
  bool ready = false;
  bool launched = false;        // in this micro-step (rounds: in this round)
  int slot = -1;
  bool from_full = false;       // the bucket is reduced out of the full buffer
  bool done = false;            // reduced in pieces at launch: nothing left to wait for
  Piece piece;                  // the collective in flight (the whole bucket)
  comm::WorkHandle work;
};

GradReducer::GradReducer(const ReducerConfig& config, const ShardLayout& layout,
                         const ShardOwnership& ownership, ReducerComms comms, memory::Device& device,
                         std::vector<UserGrad> user_grads)
    : config_(config), layout_(layout), ownership_(ownership), comms_(comms), device_(device),
      stream_(device.create_stream("reduce")), event_(device.create_event()),
      shard_order_(device, *comms.shard, config.timeout), user_grads_(std::move(user_grads)),
      buffers_(device, Category::kCommBuffer), scratch_cache_(device, Category::kCommBuffer) {
  ZERO_CHECK(config_.full_grads || config_.accumulate, "reduced gradients need a home");
  ZERO_CHECK(!config_.rounds || (config_.accumulate && !config_.full_grads), "rounds reduce into the accumulator");
  ZERO_CHECK_EQ(user_grads_.size(), layout_.tensors().size());
  if (comms_.replica != nullptr) {
    replica_order_ = std::make_unique<CollectiveOrder>(device, *comms_.replica, config.timeout);
  }
  if (config_.quantized) {
    ZERO_CHECK(comms_.node != nullptr && !ownership_.is_replicated(), "qgZ reduces sharded buckets within nodes");
    memory::check_block_quantization(*config_.quantized, "EngineOptions.quantized_gradients");
    node_order_ = std::make_unique<CollectiveOrder>(device, *comms_.node, config.timeout);
    if (comms_.across_nodes) across_order_ = std::make_unique<CollectiveOrder>(device, *comms_.across_nodes, config.timeout);
  }
  if (config_.full_grads) ensure_full();
  if (config_.accumulate) {
    // Optimizer space: the padded flat space (replicated) or the shard, in one dtype or each
    // bucket's.
    const size_t bytes = config_.accum_dtype ? ownership_.numel() * dtype_size(*config_.accum_dtype)
                         : ownership_.is_replicated() ? layout_.padded_bytes()
                                                      : layout_.shard_bytes();
    accum_ = device_.allocate(bytes, Category::kGrads);
  }
  buckets_.resize(layout_.buckets().size());
  bucket_has_data_.assign(buckets_.size(), 0);
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
      if (buckets_[b].work) buckets_[b].work->wait(config_.timeout);
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
  full_ = device_.allocate(layout_.padded_bytes(), Category::kGrads);
}

void* GradReducer::in_full(size_t b, size_t flat) { return full_.as<char>() + layout_.flat_bytes(b, flat); }

size_t GradReducer::accum_offset(size_t b, size_t opt) const {
  if (config_.accum_dtype) return opt * dtype_size(*config_.accum_dtype);
  return ownership_.is_replicated() ? layout_.flat_bytes(b, opt) : layout_.shard_bytes(b, opt);
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
  // Bound the buffers in flight: finish the oldest reductions until one gives its slot back (a bucket
  // reduced in place holds none: a bucket already in the reduce dtype beside converted ones).
  while (free_slots_.empty() && static_cast<int>(slots_.size()) >= config_.max_inflight && !inflight_.empty()) {
    complete(inflight_.front());
  }
  if (free_slots_.empty()) {
    slots_.push_back(std::make_unique<Slot>());
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
    return in_full(b, B.offset);
  }
  if (st.slot < 0) st.slot = acquire_slot();
  Slot& s = slot(st.slot);
  if (s.staging.empty()) {
    memory::Stream& compute = device_.compute_stream();
    s.staging = buffers_.take(layout_.bucket_bytes(b), compute);
    device_.fill_zero(s.staging.data(), s.staging.size_bytes(), compute);
  }
  return s.staging.data();
}

void* GradReducer::grad(size_t t) {
  ZERO_CHECK(open_, "grad() outside a micro-step");
  const auto& T = layout_.tensors()[t];
  const auto [first, last] = layout_.buckets_of_tensor(t);
  if (uses_full()) return in_full(first, T.offset);
  if (first == last) return at(bucket_buffer(first), T.dtype, T.offset - layout_.buckets()[first].offset);
  // A tensor spanning buckets gets a contiguous scratch buffer, copied into the buckets when ready.
  if (scratch_[t].empty()) {
    memory::Stream& compute = device_.compute_stream();
    scratch_[t] = scratch_cache_.take(T.numel * dtype_size(T.dtype), compute);
    device_.fill_zero(scratch_[t].data(), scratch_[t].size_bytes(), compute);
  }
  return scratch_[t].data();
}

void GradReducer::stage_tensor(size_t t) {
  const auto& T = layout_.tensors()[t];
  const DType dt = T.dtype;
  const bool full = uses_full();
  const void* src = user_grads_[t].ptr;
  if (src == nullptr && !full && !scratch_[t].empty()) src = scratch_[t].data();
  if (src == nullptr) return;  // written in place
  memory::Stream& compute = device_.compute_stream();
  const auto [first, last] = layout_.buckets_of_tensor(t);
  if (full) {
    // The full buffer may hold earlier micro-steps: add to it.
    device_.accumulate(in_full(first, T.offset), dt, src, dt, T.numel, compute);
  } else {
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
    scratch_cache_.give(std::move(scratch_[t]), compute);  // reused once the compute stream is past the copies
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
  if (config_.rounds) {
    for (size_t b = 0; b < nb; ++b) {
      if (buckets_[b].ready && !buckets_[b].launched) launch(b);
    }
    return;
  }
  while (launched_ < nb && buckets_[nb - 1 - launched_].ready) launch(nb - 1 - launched_);
}

void GradReducer::begin_round(size_t b) {
  ZERO_CHECK(config_.rounds, "begin_round() without ReducerConfig::rounds");
  BucketState& st = buckets_[b];
  if (!st.launched) return;
  if (std::find(inflight_.begin(), inflight_.end(), b) != inflight_.end()) complete(b);
  const auto& B = layout_.buckets()[b];
  st = BucketState{};
  st.pending = B.end_tensor - B.first_tensor;
  for (size_t t = B.first_tensor; t < B.end_tensor; ++t) ready_[t] = 0;
  --launched_;
}

void GradReducer::launch(size_t b) {
  fault::point("reduce_scatter");
  const auto& B = layout_.buckets()[b];
  BucketState& st = buckets_[b];
  st.launched = true;
  ++launched_;
  const DType rd = reduce_dtype(b);
  void* grads = bucket_buffer(b);
  const bool convert = rd != B.dtype;
  const bool own_buffer = convert || config_.deterministic || config_.quantized;
  if (st.slot < 0 && own_buffer) st.slot = acquire_slot();
  // The reduce stream picks the bucket up once backward's writes to it are done.
  device_.record(*event_, device_.compute_stream());
  device_.wait(*stream_, *event_);
  inflight_.push_back(b);
  if (own_buffer && config_.piece_numel > 0 && !ownership_.is_replicated() && B.padded > config_.piece_numel) {
    launch_in_pieces(b, grads);
    return;
  }
  void* cbuf = grads;
  if (convert) {
    Slot& s = slot(st.slot);
    s.send = buffers_.take(B.padded * dtype_size(rd), *stream_);
    device_.convert(grads, B.dtype, s.send.data(), rd, B.padded, *stream_);
    cbuf = s.send.data();
  }
  st.piece = Piece{cbuf, 0, B.chunk};
  st.work = issue(b, st.piece);
}

// A bucket larger than piece_numel that needs a buffer of its own: piece by piece, each rank's
// [begin, begin + len) of every chunk gathered (converted) into one bounded send buffer, reduced and
// routed before the next piece reuses the buffer. Stream-ordered on CUDA; on the host the pieces
// wait in turn here.
void GradReducer::launch_in_pieces(size_t b, const void* grads) {
  const auto& B = layout_.buckets()[b];
  BucketState& st = buckets_[b];
  const DType rd = reduce_dtype(b), md = B.dtype;
  const size_t world = static_cast<size_t>(comms_.shard->size());
  const size_t per_rank = (config_.piece_numel + world - 1) / world;
  Slot& s = slot(st.slot);
  s.send = buffers_.take(world * std::min(per_rank, B.chunk) * dtype_size(rd), *stream_);
  for (size_t begin = 0; begin < B.chunk; begin += per_rank) {
    const size_t len = std::min(per_rank, B.chunk - begin);
    device_.convert_rows(at(grads, md, begin), md, B.chunk, s.send.data(), rd, len, world, len, *stream_);
    const Piece piece{s.send.data(), begin, len};
    comm::WorkHandle work = issue(b, piece);
    finish(b, piece, *work);
  }
  st.done = true;
}

comm::WorkHandle GradReducer::issue(size_t b, const Piece& piece) {
  if (config_.quantized) return issue_quantized(b, piece);
  const auto& B = layout_.buckets()[b];
  BucketState& st = buckets_[b];
  const DType rd = reduce_dtype(b);
  comm::Communicator& comm = shard_order_.comm();
  shard_order_.before_issue(*stream_);
  // Named for the schedule check, so a rank whose reduction meets another rank's different call is
  // told which gradients it was reducing.
  comm::CallLabel label(comm, gradient_label(b, ""));
  if (config_.deterministic) {
    Slot& s = slot(st.slot);
    const size_t replicas = comms_.replica ? static_cast<size_t>(comms_.replica->size()) : 1;
    const size_t bytes = static_cast<size_t>(comm.size()) * piece.len * dtype_size(rd) * replicas;
    if (s.recv.size_bytes() != bytes) {
      buffers_.give(std::move(s.recv), *stream_);
      s.recv = buffers_.take(bytes, *stream_);
    }
    // With replicas, this replica's copies go to its place in the replica all-gather (in place).
    const size_t mine = comms_.replica ? static_cast<size_t>(comms_.replica->rank()) * comm.size() * piece.len : 0;
    return comm.all_to_all(piece.cbuf, at(s.recv.data(), rd, mine), piece.len, rd);
  }
  if (ownership_.is_replicated()) return comm.all_reduce(piece.cbuf, B.padded, rd, comm::ReduceOp::kSum);
  return comm.reduce_scatter(piece.cbuf, at(piece.cbuf, rd, static_cast<size_t>(comm.rank()) * piece.len), piece.len,
                             rd, comm::ReduceOp::kSum);
}

void GradReducer::finish(size_t b, const Piece& piece, comm::Work& work) {
  const auto& B = layout_.buckets()[b];
  BucketState& st = buckets_[b];
  const DType rd = reduce_dtype(b);
  comm::Communicator& comm = shard_order_.comm();
  const bool replicated = ownership_.is_replicated();
  // This rank's reduced share: its chunk's [begin, begin + len) (the whole bucket when replicated).
  const size_t mine = replicated ? 0 : static_cast<size_t>(comm.rank()) * piece.len;
  void* chunk = at(piece.cbuf, rd, static_cast<size_t>(comm.rank()) * piece.len);
  {
    ScopedTimer waiting(config_.timings ? &config_.timings->reduce_wait_s : nullptr);
    (config_.quantized ? *node_order_ : shard_order_).after(work, *stream_);
  }
  if (config_.quantized) {
    finish_quantized(b, piece, chunk);
    if (comms_.replica != nullptr) {
      replica_order_->before_issue(*stream_);
      comm::WorkHandle w = comms_.replica->all_reduce(chunk, piece.len, rd, comm::ReduceOp::kSum);
      replica_order_->after(*w, *stream_);
    }
  } else if (config_.deterministic) {
    // recv holds every rank's copy of this rank's share; with replicas, gathered replica by replica,
    // which is global rank order. Sum them in that order.
    Slot& s = slot(st.slot);
    int k = comm.size();
    if (comms_.replica != nullptr) {
      const size_t count = static_cast<size_t>(comm.size()) * piece.len;
      const void* own = at(s.recv.data(), rd, static_cast<size_t>(comms_.replica->rank()) * count);
      replica_order_->before_issue(*stream_);
      comm::WorkHandle w = comms_.replica->all_gather(own, s.recv.data(), count, rd);
      replica_order_->after(*w, *stream_);
      k *= comms_.replica->size();
    }
    device_.ordered_sum(s.recv.data(), rd, piece.len, k, chunk, rd, piece.len, *stream_);
    if (replicated) {
      shard_order_.before_issue(*stream_);
      comm::WorkHandle w = comm.all_gather(chunk, piece.cbuf, piece.len, rd);
      shard_order_.after(*w, *stream_);
    }
  } else if (comms_.replica != nullptr) {
    replica_order_->before_issue(*stream_);
    comm::WorkHandle w = comms_.replica->all_reduce(chunk, piece.len, rd, comm::ReduceOp::kSum);
    replica_order_->after(*w, *stream_);
  }
  // Route the owned part of what was reduced: flat elements [lo, hi).
  const OwnedRange own = ownership_.range(b);
  const size_t piece_lo = replicated ? B.offset : B.offset + static_cast<size_t>(comm.rank()) * B.chunk + piece.begin;
  const size_t piece_hi = replicated ? B.offset + B.padded : piece_lo + piece.len;
  const size_t lo = std::max(own.flat_begin, piece_lo), hi = std::min(own.flat_begin + own.len, piece_hi);
  if (lo >= hi) return;
  const void* reduced = at(piece.cbuf, rd, mine + (lo - piece_lo));
  if (config_.accumulate) {
    void* acc = accum_.as<char>() + accum_offset(b, own.opt_begin + (lo - own.flat_begin));
    if (accum_has_data_ || bucket_has_data_[b]) {
      device_.accumulate(acc, accum_dtype(b), reduced, rd, hi - lo, *stream_);
    } else {
      device_.convert(reduced, rd, acc, accum_dtype(b), hi - lo, *stream_);
    }
  } else if (void* home = in_full(b, lo); reduced != home) {
    // Reduced in another dtype (or in a piece's buffer): store the result back in the full buffer,
    // rounded once.
    device_.convert(reduced, rd, home, B.dtype, hi - lo, *stream_);
  }
}

// qgZ's two hops. The shard group is N nodes of L consecutive ranks: shard rank r is local rank
// r % L of node r / L. Row r of the piece (what shard rank r gets) first goes to this node's rank of
// local index r % L, which gathers from its L node peers the rows of every rank of its local index
// (ZeRO++'s reordering: the rows are quantized straight into the order the all-to-all sends them).
// It sums the L copies of each, and the second hop sends each node's sum to that node's rank.
GradReducer::Hops GradReducer::hops(const Piece& piece) const {
  const size_t world = static_cast<size_t>(comms_.shard->size()), local = static_cast<size_t>(comms_.node->size());
  return {world, local, world / local, config_.quantized->segment_bytes(piece.len)};
}

std::string GradReducer::gradient_label(size_t b, const char* suffix) const {
  const int unit = layout_.buckets()[b].unit;
  return unit >= 0 ? fmt::format("unit {} gradients{}", unit, suffix) : fmt::format("bucket {} gradients{}", b, suffix);
}

void GradReducer::set_step(int64_t step, int64_t micro_step) {
  step_key_ = splitmix64(splitmix64(static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(micro_step));
}

uint64_t GradReducer::rounding_key(size_t b, const Piece& piece, size_t row, int hop) const {
  if (!config_.stochastic_rounding) return 0;
  uint64_t k = step_key_;
  for (uint64_t v : {uint64_t{b}, uint64_t{piece.begin}, uint64_t{row}, static_cast<uint64_t>(hop),
                     static_cast<uint64_t>(comms_.shard->rank())}) {
    k = splitmix64(k ^ v);
  }
  return k | 1;  // never 0, which means round to nearest
}

comm::WorkHandle GradReducer::issue_quantized(size_t b, const Piece& piece) {
  const DType rd = reduce_dtype(b);
  memory::BlockQuantization q = *config_.quantized;
  comm::Communicator& node = *comms_.node;
  const auto [world, local, nodes, seg] = hops(piece);
  Slot& s = slot(buckets_[b].slot);
  s.qsend = buffers_.take(world * seg, *stream_);
  s.qrecv = buffers_.take(world * seg, *stream_);
  for (size_t r = 0; r < world; ++r) {
    char* dst = s.qsend.as<char>() + ((r % local) * nodes + r / local) * seg;
    q.stochastic_key = rounding_key(b, piece, r, 0);
    device_.quantize_blocks(at(piece.cbuf, rd, r * piece.len), rd, piece.len, q, dst, nullptr, *stream_);
  }
  node_order_->before_issue(*stream_);
  comm::CallLabel label(node, gradient_label(b, ", node"));
  return node.all_to_all(s.qsend.data(), s.qrecv.data(), nodes * seg, DType::kUInt8);
}

void GradReducer::finish_quantized(size_t b, const Piece& piece, void* chunk) {
  const DType rd = reduce_dtype(b);
  memory::BlockQuantization q = *config_.quantized;
  const auto [world, local, nodes, seg] = hops(piece);
  const size_t len = piece.len;
  Slot& s = slot(buckets_[b].slot);
  // From each node peer in rank order, the rows of this local index on every node: their sums.
  s.rows = buffers_.take(world * len * sizeof(float), *stream_);
  device_.dequantize_rows(s.qrecv.data(), seg, world, len, q, s.rows.data(), DType::kFloat32, len, *stream_);
  if (comms_.across_nodes == nullptr) {
    device_.ordered_sum(s.rows.data(), DType::kFloat32, len, static_cast<int>(local), chunk, rd, len, *stream_);
  } else {
    s.partial = buffers_.take(nodes * len * sizeof(float), *stream_);
    device_.ordered_sum(s.rows.data(), DType::kFloat32, nodes * len, static_cast<int>(local), s.partial.data(),
                        DType::kFloat32, nodes * len, *stream_);
    for (size_t n = 0; n < nodes; ++n) {
      q.stochastic_key = rounding_key(b, piece, n, 1);
      device_.quantize_blocks(s.partial.as<float>() + n * len, DType::kFloat32, len, q, s.qsend.as<char>() + n * seg,
                              nullptr, *stream_);
    }
    comm::Communicator& across = *comms_.across_nodes;
    across_order_->before_issue(*stream_);
    comm::WorkHandle w;
    {
      comm::CallLabel label(across, gradient_label(b, ", across"));
      w = across.all_to_all(s.qsend.data(), s.qrecv.data(), seg, DType::kUInt8);
    }
    {
      ScopedTimer waiting(config_.timings ? &config_.timings->reduce_wait_s : nullptr);
      across_order_->after(*w, *stream_);
    }
    device_.dequantize_rows(s.qrecv.data(), seg, nodes, len, q, s.rows.data(), DType::kFloat32, len, *stream_);
    device_.ordered_sum(s.rows.data(), DType::kFloat32, len, static_cast<int>(nodes), chunk, rd, len, *stream_);
  }
  // A piece's buffers go back for the next piece (the cache orders their reuse after this work).
  for (Buffer* buf : {&s.qsend, &s.qrecv, &s.rows, &s.partial}) buffers_.give(std::move(*buf), *stream_);
}

void GradReducer::complete(size_t b) {
  ZERO_CHECK(std::find(inflight_.begin(), inflight_.end(), b) != inflight_.end(), "bucket {} is not in flight", b);
  // Collectives complete in issue order: finish the older ones first.
  while (inflight_.front() != b) complete(inflight_.front());
  inflight_.erase(inflight_.begin());

  const auto& B = layout_.buckets()[b];
  BucketState& st = buckets_[b];
  if (config_.timings) config_.timings->reduced_bytes += B.padded * dtype_size(reduce_dtype(b));
  if (!st.done) finish(b, st.piece, *st.work);
  bucket_has_data_[b] = 1;  // a later round of this micro-step adds to it
  // The bucket's gradients are consumed: clear them for the next micro-step.
  if (config_.accumulate && st.from_full) {
    device_.fill_zero(in_full(b, B.offset), layout_.bucket_bytes(b), *stream_);
  }
  if (st.slot >= 0) {
    Slot& s = slot(st.slot);
    for (Buffer* buf : {&s.staging, &s.send, &s.recv}) buffers_.give(std::move(*buf), *stream_);
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
  std::fill(bucket_has_data_.begin(), bucket_has_data_.end(), 0);  // accum_has_data_ covers them now
  reset_buckets();
}

GradReducer::Reduced GradReducer::reduced(size_t b) const {
  const OwnedRange own = ownership_.range(b);
  if (config_.accumulate) return {accum_.as<char>() + accum_offset(b, own.opt_begin), reduced_dtype(b)};
  return {full_.as<char>() + layout_.flat_bytes(b, own.flat_begin), reduced_dtype(b)};
}

void GradReducer::clear() {
  ZERO_CHECK(inflight_.empty(), "clear() with reductions in flight");
  memory::Stream& compute = device_.compute_stream();
  if (!full_.empty()) device_.fill_zero(full_.data(), full_.size_bytes(), compute);
  accum_has_data_ = false;
  std::fill(bucket_has_data_.begin(), bucket_has_data_.end(), 0);
  unreduced_ = false;
  for (auto& s : scratch_) scratch_cache_.give(std::move(s), compute);
  for (size_t t = 0; t < user_grads_.size(); ++t) {
    const auto& T = layout_.tensors()[t];
    if (user_grads_[t].ptr) device_.fill_zero(user_grads_[t].ptr, T.numel * dtype_size(T.dtype), compute);
  }
  open_ = false;
  reset_buckets();
  // The step's end: every staging and scratch buffer is back, and their slabs grow here if the step
  // outgrew them.
  buffers_.settle();
  scratch_cache_.settle();
}

}  // namespace zero
