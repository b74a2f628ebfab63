#include "zero/matrix_exchange.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "memory/meta_device.h"

namespace zero {

MatrixExchange::MatrixExchange(const ShardLayout& layout, const ShardOwnership& ownership,
                               std::vector<ExchangedMatrix> matrices, comm::Communicator* shard,
                               memory::Device& device, std::chrono::milliseconds timeout)
    : layout_(layout),
      shard_(ownership.is_replicated() || shard == nullptr || shard->size() == 1 ? nullptr : shard),
      timeout_(timeout), by_bucket_(layout.buckets().size()), input_at_(layout.buckets().size(), 0),
      owner_(layout.tensors().size(), -1) {
  const int world = shard_ ? shard_->size() : 1;
  flops_.assign(static_cast<size_t>(world), 0.0);
  if (shard_ != nullptr && !shard_->accepts(memory::DeviceKind::kHost)) {
    ZERO_THROW(InvalidArgument,
               "Muon's matrix exchange works in host memory but the shard group's {} communicator takes device "
               "memory only", shard_->backend_name());
  }
  for (size_t b = 0; b < layout.buckets().size(); ++b) bucket_at_[ownership.range(b).opt_begin] = b;
  for (const ExchangedMatrix& m : matrices) {
    const ShardLayout::Tensor& t = layout.tensors().at(m.tensor);
    const auto [first, last] = layout.buckets_of_tensor(m.tensor);
    if (first != last) {
      ZERO_THROW(InvalidArgument, "layout tensor {} lies across buckets {} and {}: Muon needs whole-tensor buckets",
                 m.tensor, first, last);
    }
    const size_t whole = m.rows * m.cols;
    ZERO_CHECK(m.whole ? whole % t.numel == 0 : whole == t.numel, "matrix {} x {} for a tensor of {} elements", m.rows,
               m.cols, t.numel);
    by_bucket_[first].push_back({m, t.offset - layout.buckets()[first].offset, t.numel, 0, 0});
  }
  // The whole step's matrices, the largest first, each to the least loaded rank (ties: the lowest),
  // so that every rank computes the same assignment.
  std::vector<Placed*> order;
  size_t largest = 0, owned = 0, inputs = 0;
  for (size_t b = 0; b < by_bucket_.size(); ++b) {
    if (by_bucket_[b].empty()) continue;
    matrix_buckets_.push_back(b);
    largest = std::max(largest, layout.buckets()[b].padded);
    owned = std::max(owned, ownership.range(b).len);
    input_at_[b] = inputs;
    inputs += ownership.range(b).len;
    for (Placed& p : by_bucket_[b]) order.push_back(&p);
  }
  auto flops = [](const Placed& p) { return optim::newton_schulz_flops(p.m.rows, p.m.cols, p.m.ns.steps); };
  std::stable_sort(order.begin(), order.end(), [&](const Placed* x, const Placed* y) { return flops(*x) > flops(*y); });
  std::vector<size_t> mine(static_cast<size_t>(world), 0);  // each rank's matrices' elements
  for (Placed* p : order) {
    const size_t least = static_cast<size_t>(std::min_element(flops_.begin(), flops_.end()) - flops_.begin());
    p->owner = static_cast<int>(least);
    flops_[least] += flops(*p);
    owner_[p->m.tensor] = p->owner;
  }
  // Each rank's buffer holds its matrices in bucket order, the order every rank visits them in.
  for (size_t b : matrix_buckets_) {
    for (Placed& p : by_bucket_[b]) {
      p.mine_offset = mine[static_cast<size_t>(p.owner)];
      mine[static_cast<size_t>(p.owner)] += p.numel;
    }
  }
  const bool meta = dynamic_cast<memory::MetaDevice*>(&device) != nullptr;
  auto allocate = [&](size_t n) {
    memory::Buffer buf = device.allocate_elements(static_cast<int64_t>(n), DType::kFloat32, memory::Category::kCommBuffer);
    if (!meta && device.kind() != memory::DeviceKind::kCuda) std::memset(buf.data(), 0, n * sizeof(float));
    return buf;
  };
  if (shard_ == nullptr) {
    if (owned > 0) input_ = allocate(owned);
    return;
  }
  if (inputs > 0) input_ = allocate(inputs);
  // Every rank's buffer as large as the largest rank's share: the memory is the same on every rank.
  const size_t most = *std::max_element(mine.begin(), mine.end());
  if (most > 0) mine_ = allocate(most);
  if (largest > 0) {
    gathered_ = allocate(largest);
    out_ = allocate(largest);
  }
}

size_t MatrixExchange::bucket_at(size_t opt_begin) const {
  const auto it = bucket_at_.find(opt_begin);
  return it == bucket_at_.end() ? SIZE_MAX : it->second;
}

float* MatrixExchange::input(size_t bucket) {
  ZERO_CHECK(has_matrices(bucket), "bucket {} holds no matrix", bucket);
  return input_.as<float>() + (shard_ != nullptr ? input_at_[bucket] : 0);
}

bool MatrixExchange::has_matrices(size_t bucket) const { return bucket < by_bucket_.size() && !by_bucket_[bucket].empty(); }

int MatrixExchange::owner(size_t tensor) const { return owner_.at(tensor); }

void MatrixExchange::orthogonalize_bucket(size_t bucket) {
  ZERO_CHECK(shard_ == nullptr, "orthogonalize_bucket where the shard group exchanges (orthogonalize_step)");
  // The owned range is the bucket: every matrix is here whole.
  float* u = input(bucket);
  for (const Placed& p : by_bucket_.at(bucket)) orthogonalize_one(p, u + p.bucket_offset);
}

void MatrixExchange::orthogonalize_step() {
  ZERO_CHECK(shard_ != nullptr, "orthogonalize_step without a shard group to exchange over (orthogonalize_bucket)");
  float* whole = gathered_.as<float>();
  float* out = out_.as<float>();
  float* mine = mine_.as<float>();
  const int me = shard_->rank();
  comm::CallLabel label(*shard_, "muon exchange");
  for (size_t b : matrix_buckets_) {
    shard_->all_gather(input(b), whole, layout_.buckets()[b].chunk, DType::kFloat32)->wait(timeout_);
    for (const Placed& p : by_bucket_[b]) {
      if (p.owner == me) std::memcpy(mine + p.mine_offset, whole + p.bucket_offset, p.numel * sizeof(float));
    }
  }
  for (size_t b : matrix_buckets_) {
    for (const Placed& p : by_bucket_[b]) {
      if (p.owner == me) orthogonalize_one(p, mine + p.mine_offset);
    }
  }
  for (size_t b : matrix_buckets_) {
    const ShardLayout::Bucket& bk = layout_.buckets()[b];
    std::memset(out, 0, bk.padded * sizeof(float));
    for (const Placed& p : by_bucket_[b]) {
      if (p.owner == me) std::memcpy(out + p.bucket_offset, mine + p.mine_offset, p.numel * sizeof(float));
    }
    shard_->reduce_scatter(out, input(b), bk.chunk, DType::kFloat32, comm::ReduceOp::kSum)->wait(timeout_);
  }
}

void MatrixExchange::orthogonalize_one(const Placed& p, float* x) {
  if (!p.m.whole) {
    optim::newton_schulz(x, p.m.rows, p.m.cols, x, p.m.ns);
    return;
  }
  float* const part[] = {x};
  p.m.whole(part, p.numel, [&](std::span<float* const> matrix, size_t numel) {
    ZERO_CHECK(numel == p.m.rows * p.m.cols, "a {} x {} matrix gathered as {} elements", p.m.rows, p.m.cols, numel);
    optim::newton_schulz(matrix[0], p.m.rows, p.m.cols, matrix[0], p.m.ns);
  });
}

}  // namespace zero
