#pragma once
// ShardedUpdate: the optimizer step over the rank's owned ranges.
//
//   0. the gradients that are partial sums over a finalizer's group (tensor parallelism's layer
//      norms under sequence parallelism) completed (PartialGradSum), before anything reads them;
//      at the first step, the copies' gradients checked equal over their groups (CopiedGradCheck);
//   1. the global gradient norm: sums of squares per block of the flat space, each rank computing
//      the blocks it owns, gathered and added in global block order, so the norm has the same bits
//      at every stage and world size (see ShardLayout);
//   2. the overflow decision (skip the step on every rank, back off the loss scale) and the clip
//      coefficient (torch.nn.utils.clip_grad_norm_);
//   3. the optimizer bucket by bucket through the UpdateApplier (on the device, or offloaded to the
//      host), each bucket's new 16-bit values handed to the ParamWriteback (which all-gathers them
//      while the next bucket updates, or writes them locally).
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "memory/device.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "zero/collective_order.h"
#include "zero/copied_grad_check.h"
#include "zero/grad_reducer.h"
#include "zero/param_writeback.h"
#include "zero/partial_grad_sum.h"
#include "zero/shard_optimizer.h"
#include "zero/update_applier.h"
#include "zero/shard_ownership.h"
#include "zero/step_result.h"

namespace zero {

struct UpdateConfig {
  float max_grad_norm = 0.0f;  // 0: no clipping
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Tensor or pipeline parallelism (none without either): the sum of squares counts the blocks
  // `counted` marks (per block of the flat space; empty: all) and is then added over
  // `model_parallel`, so that every element of the model counts once.
  comm::Communicator* model_parallel = nullptr;
  // The flat space's blocks in runs of one unit and one `counted` state, in order (a run starts
  // where the previous one ends); blocks past the last run (padding, zeros): unit 0, counted.
  // Empty: every block unit 0 and counted. The sum of squares is kept per unit and the units are
  // added in id order after the sum over `model_parallel`, so the norm's rounding does not depend
  // on which pipeline stage holds which unit (schedules with other layouts give bitwise the same
  // step when the stages number their units as one model does). Runs, not a list per block: a
  // model of a trillion parameters has a billion blocks.
  struct BlockRun {
    size_t end = 0;  // one past the run's last block
    int unit = 0;
    bool counted = true;
  };
  std::vector<BlockRun> runs;
  // At the first step whose gradients are finite, the copied parameters' gradients compared over
  // their groups (zero/copied_grad_check.h) and the verdict agreed over the shard group and
  // `model_parallel`: set on every rank alike (a finalizer's group of more than one rank that shares
  // the registration).
  bool check_copies = false;
};

class ShardedUpdate {
 public:
  // `partial_sums`: the sums to complete before the norm (zero/grad_finalizer.h). `config`'s
  // per-block lists are turned into runs_ and not kept (pass it moved: they are a value per block).
  ShardedUpdate(UpdateConfig config, const ShardLayout& layout, const ShardOwnership& ownership,
                comm::Communicator& shard_comm, memory::Device& device, std::unique_ptr<UpdateApplier> applier,
                ParamWriteback& writeback, std::vector<std::unique_ptr<PartialGradSum>> partial_sums = {},
                std::vector<std::unique_ptr<CopiedGradCheck>> copied_checks = {});

  // Steps with the reduced gradients. `divisor` turns reduced sums into means (ranks x micro-steps)
  // and `loss_scale` is the scale the loss carried; with a scaler, an overflow skips the step. On
  // success the caller clears the gradients.
  StepResult step(const GradReducer& grads, float loss_scale, double divisor, optim::DynamicLossScaler* scaler,
                  int64_t steps_taken);

  ShardOptimizer& optimizer() { return applier_->optimizer(); }
  UpdateApplier& applier() { return *applier_; }

 private:
  double global_sum_of_squares(const GradReducer& grads);
  double add_over_model_parallel();
  // Throws InvalidArgument on every rank when a copied parameter's gradient differs across its group
  // on any rank (naming it where this rank found it).
  void check_copies(const GradReducer& grads);

  UpdateConfig config_;  // without its per-block lists (runs_ holds them)
  const ShardLayout& layout_;
  const ShardOwnership& ownership_;
  comm::Communicator& comm_;
  memory::Device& device_;
  ParamWriteback& writeback_;
  CollectiveOrder order_;
  std::unique_ptr<UpdateApplier> applier_;
  memory::Buffer block_sums_;     // owned blocks' sums of squares (device)
  memory::Buffer gathered_sums_;  // every rank's, when sharded (device)
  memory::Buffer host_sums_;      // host staging of the above
  std::unique_ptr<memory::Event> sums_ready_;
  size_t owned_blocks_ = 0;
  std::vector<std::unique_ptr<PartialGradSum>> partial_sums_;
  std::vector<std::unique_ptr<CopiedGradCheck>> copied_checks_;
  bool copies_checked_ = false;
  memory::Buffer verdict_, verdict_host_;  // the largest difference found, agreed over the ranks
  std::unique_ptr<CollectiveOrder> mp_order_;             // with tensor or pipeline parallelism
  memory::Buffer mp_total_, mp_host_;                     // the per-unit sums of squares, added over mp
  size_t units_ = 1;                                      // unit ids below this, on every mp rank
  // UpdateConfig's runs, the last open-ended: the step's host sum adds a run's blocks in a register
  // instead of looking each block up.
  using BlockRun = UpdateConfig::BlockRun;
  std::vector<BlockRun> runs_;
};

}  // namespace zero
