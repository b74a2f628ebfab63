#pragma once
// CopiedGradCheck: at the first step whose gradients are finite, whether the gradients of the
// parameters that every rank of a finalizer's group holds whole (zero/grad_finalizer.h: "copies";
// under tensor parallelism the replicated parameters) are the same on every rank of the group, as
// they must be for the copies to stay one tensor. The wiring it catches trains silently wrong
// otherwise: a LayerNorm under sequence parallelism registered replicated instead of
// TpPlacement::replicated_partial() sees only this rank's tokens, so each rank steps its copy by its
// own part of the gradient and the copies drift apart (the global norm counts only the group's rank
// 0's).
//
// The rank's reduced pieces of those parameters go out packed, in fp32 rounds of at most kChunk
// elements (buffers held for the check only), twice: all-reduced by max and by min over the group.
// A piece differs where max - min exceeds kTolerance times its largest magnitude: a copy's gradient
// is the same computation on the same values on every rank (bitwise equal on the host; a GPU kernel
// with atomics may differ in the last bits, hence the tolerance), while a missing partial sum differs
// by the other ranks' parts. Non-finite values (a step that overflowed) are left out; the update
// then checks at the next step.
//
// Every rank of the group owns the same pieces (the group's ranks share their data-parallel
// coordinate, hence their ownership: same_registration()), so the packs line up.
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "comm/communicator.h"
#include "memory/device.h"
#include "zero/collective_order.h"

namespace zero {

class CopiedGradCheck {
 public:
  static constexpr float kTolerance = 1e-3f;
  static constexpr size_t kChunk = size_t{1} << 20;

  struct Piece {
    size_t bucket = 0;
    size_t offset = 0;  // elements into the bucket's reduced gradient
    size_t len = 0;
    DType dtype = DType::kFloat32;  // the reduced gradient's
    std::string name;               // the parameter's
  };
  // The worst piece on this rank: its relative difference over the group (0: none) and its name.
  struct Verdict {
    float difference = 0.0f;
    std::string name;
  };

  // `what` names the group in messages ("tensor-parallel").
  CopiedGradCheck(memory::Device& device, comm::Communicator& group, std::string what, std::vector<Piece> pieces,
                  std::chrono::milliseconds timeout);

  const std::string& what() const { return what_; }

  // Compares the pieces over the group (collective), bucket b's reduced gradient at bucket_base(b).
  // Blocks until the result is on the host. On a device that holds no values (planning) it finds
  // nothing and calls nothing (every rank of a plan alike).
  using BucketBase = std::function<const void*(size_t bucket)>;
  Verdict run(const BucketBase& bucket_base);

 private:
  memory::Device& device_;
  comm::Communicator& group_;
  std::string what_;
  CollectiveOrder order_;
  std::vector<Piece> pieces_;
  std::chrono::milliseconds timeout_;
  size_t numel_ = 0;
};

}  // namespace zero
