#include "zero/partial_grad_sum.h"

#include <cstdint>

namespace zero {
namespace {

void* piece_address(const GradReducer& grads, const PartialGradSum::Piece& p) {
  const GradReducer::Reduced g = grads.reduced(p.bucket);
  // The reduced gradient is the update's to finish: the partial parts are summed in place.
  return static_cast<uint8_t*>(const_cast<void*>(g.ptr)) + p.offset * dtype_size(g.dtype);
}

}  // namespace

PartialGradSum::PartialGradSum(memory::Device& device, comm::Communicator& tp, const std::vector<Piece>& pieces,
                               std::chrono::milliseconds timeout)
    : device_(device), tp_(tp), order_(device, tp, timeout) {
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

void PartialGradSum::run(const GradReducer& grads) {
  memory::Stream& compute = device_.compute_stream();
  for (Group& g : groups_) {
    const size_t esize = dtype_size(g.dtype);
    void* buffer = g.pack.empty() ? piece_address(grads, g.pieces.front()) : g.pack.data();
    if (!g.pack.empty()) {
      size_t at = 0;
      for (const Piece& p : g.pieces) {
        device_.copy(g.pack.as<uint8_t>() + at * esize, piece_address(grads, p), p.len * esize, compute);
        at += p.len;
      }
    }
    order_.before_issue(compute);
    order_.after(*tp_.all_reduce(buffer, g.numel, g.dtype, comm::ReduceOp::kSum), compute);
    if (!g.pack.empty()) {
      size_t at = 0;
      for (const Piece& p : g.pieces) {
        device_.copy(piece_address(grads, p), g.pack.as<uint8_t>() + at * esize, p.len * esize, compute);
        at += p.len;
      }
    }
  }
}

}  // namespace zero
