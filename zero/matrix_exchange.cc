#include "zero/matrix_exchange.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "base/check.h"
#include "memory/meta_device.h"

namespace zero {

MatrixExchange::MatrixExchange(const ShardLayout& layout, const ShardOwnership& ownership,
                               std::vector<ExchangedMatrix> matrices, comm::Communicator* shard,
                               memory::Device& device, std::chrono::milliseconds timeout)
    : layout_(layout),
      shard_(ownership.is_replicated() || shard == nullptr || shard->size() == 1 ? nullptr : shard),
      timeout_(timeout), by_bucket_(layout.buckets().size()), owner_(layout.tensors().size(), -1) {
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
    by_bucket_[first].push_back({m, t.offset - layout.buckets()[first].offset, t.numel, 0});
  }
  size_t largest = 0, owned = 0;
  for (size_t b = 0; b < by_bucket_.size(); ++b) {
    std::vector<Placed>& placed = by_bucket_[b];
    if (placed.empty()) continue;
    largest = std::max(largest, layout.buckets()[b].padded);
    owned = std::max(owned, ownership.range(b).len);
    // The largest first, each to the least loaded rank (ties: the lowest), so that every rank
    // computes the same assignment.
    std::vector<size_t> order(placed.size());
    std::iota(order.begin(), order.end(), size_t{0});
    auto flops = [&](const Placed& p) { return optim::newton_schulz_flops(p.m.rows, p.m.cols, p.m.ns.steps); };
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return flops(placed[x]) > flops(placed[y]); });
    std::vector<double> load(static_cast<size_t>(world), 0.0);  // this bucket's
    for (size_t i : order) {
      // The least loaded in this bucket (the exchange waits for its slowest rank), then over the
      // buckets so far (so that buckets of fewer matrices than ranks do not all go to rank 0).
      size_t least = 0;
      for (size_t r = 1; r < load.size(); ++r) {
        if (std::pair(load[r], flops_[r]) < std::pair(load[least], flops_[least])) least = r;
      }
      placed[i].owner = static_cast<int>(least);
      load[least] += flops(placed[i]);
      flops_[least] += flops(placed[i]);
      owner_[placed[i].m.tensor] = placed[i].owner;
    }
  }
  if (owned > 0) {
    input_ = device.allocate_elements(static_cast<int64_t>(owned), DType::kFloat32, memory::Category::kCommBuffer);
    const bool meta = dynamic_cast<memory::MetaDevice*>(&device) != nullptr;
    if (!meta && device.kind() != memory::DeviceKind::kCuda) std::memset(input_.data(), 0, owned * sizeof(float));
  }
  if (shard_ != nullptr && largest > 0) {
    gathered_ = device.allocate_elements(static_cast<int64_t>(largest), DType::kFloat32, memory::Category::kCommBuffer);
    out_ = device.allocate_elements(static_cast<int64_t>(largest), DType::kFloat32, memory::Category::kCommBuffer);
  }
}

size_t MatrixExchange::bucket_at(size_t opt_begin) const {
  const auto it = bucket_at_.find(opt_begin);
  return it == bucket_at_.end() ? SIZE_MAX : it->second;
}

float* MatrixExchange::input(size_t bucket) {
  ZERO_CHECK(has_matrices(bucket), "bucket {} holds no matrix", bucket);
  return input_.as<float>();
}

bool MatrixExchange::has_matrices(size_t bucket) const { return bucket < by_bucket_.size() && !by_bucket_[bucket].empty(); }

int MatrixExchange::owner(size_t tensor) const { return owner_.at(tensor); }

void MatrixExchange::orthogonalize(size_t bucket, float* u) {
  const std::vector<Placed>& placed = by_bucket_.at(bucket);
  if (placed.empty()) return;
  if (shard_ == nullptr) {
    // The owned range is the bucket: every matrix is here whole.
    for (const Placed& p : placed) orthogonalize_one(p, u + p.bucket_offset);
    return;
  }
  const ShardLayout::Bucket& bk = layout_.buckets()[bucket];
  float* whole = gathered_.as<float>();
  float* out = out_.as<float>();
  comm::CallLabel label(*shard_, "muon exchange");
  shard_->all_gather(u, whole, bk.chunk, DType::kFloat32)->wait(timeout_);
  std::memset(out, 0, bk.padded * sizeof(float));
  const int me = shard_->rank();
  for (const Placed& p : placed) {
    if (p.owner != me) continue;
    std::memcpy(out + p.bucket_offset, whole + p.bucket_offset, p.numel * sizeof(float));
    orthogonalize_one(p, out + p.bucket_offset);
  }
  shard_->reduce_scatter(out, u, bk.chunk, DType::kFloat32, comm::ReduceOp::kSum)->wait(timeout_);
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
