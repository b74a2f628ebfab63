#include "zero/partial_grad_sum.h"

#include <cstdint>

namespace zero {

PartialGradSum::PartialGradSum(memory::Device& device, comm::Communicator& group, const std::vector<Piece>& pieces,
                               std::chrono::milliseconds timeout)
    : device_(device), group_(group), order_(device, group, timeout) {
  for (const Piece& p : pieces) {
    Group* g = nullptr;
    for (Group& existing : groups_) {
      if (existing.dtype == p.dtype) g = &existing;
    }
    if (g == nullptr) g = &groups_.emplace_back(Group{.dtype = p.dtype});
    g->pieces.push_back(p);
    g->numel += p.len;
  }
  for (Group& g : groups_) {
    if (g.pieces.size() > 1) {
      g.pack = device_.allocate_elements(static_cast<int64_t>(g.numel), g.dtype, memory::Category::kCommBuffer);
    }
  }
}

void PartialGradSum::run(const BucketBase& bucket_base) {
  memory::Stream& compute = device_.compute_stream();
  for (Group& g : groups_) {
    const size_t esize = dtype_size(g.dtype);
    auto piece_address = [&](const Piece& p) { return static_cast<uint8_t*>(bucket_base(p.bucket)) + p.offset * esize; };
    void* buffer = g.pack.empty() ? piece_address(g.pieces.front()) : g.pack.data();
    if (!g.pack.empty()) {
      size_t at = 0;
      for (const Piece& p : g.pieces) {
        device_.copy(g.pack.as<uint8_t>() + at * esize, piece_address(p), p.len * esize, compute);
        at += p.len;
      }
    }
    order_.before_issue(compute);
    order_.after(*group_.all_reduce(buffer, g.numel, g.dtype, comm::ReduceOp::kSum), compute);
    if (!g.pack.empty()) {
      size_t at = 0;
      for (const Piece& p : g.pieces) {
        device_.copy(piece_address(p), g.pack.as<uint8_t>() + at * esize, p.len * esize, compute);
        at += p.len;
      }
    }
  }
}

}  // namespace zero
