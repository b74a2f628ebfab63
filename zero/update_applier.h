#pragma once
// Where the optimizer runs over the rank's owned ranges, and where the fp32 master weights and the
// optimizer state live: beside the gradients on the engine's device (make_device_applier), or in
// host memory, updated by the CPU optimizer (OffloadPipeline, zero/offload_pipeline.h). ShardedUpdate
// decides whether to step and with which gradient scale (norm, overflow, clip); the applier steps.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "memory/device.h"
#include "optim/optimizer.h"
#include "comm/communicator.h"
#include "zero/grad_reducer.h"
#include "zero/matrix_exchange.h"
#include "zero/param_writeback.h"
#include "zero/shard_layout.h"
#include "zero/shard_optimizer.h"
#include "zero/shard_ownership.h"
#include "zero/split_tensor.h"

namespace zero {

struct UpdateTensor {
  std::string name;
  int group = 0;
  const void* data = nullptr;  // the parameter's registered values (device memory), read once for the master
  DType dtype = DType::kFloat32;  // theirs
  SplitTensor split;            // a part of a tensor held across ranks (a finalizer's split); empty: whole
  std::vector<int64_t> shape;   // as registered (the part's; Muon's matrices: rows = shape[0], cols = the rest)
};

struct ApplierInputs {
  optim::OptimizerOptions optimizer;
  const ShardLayout* layout = nullptr;
  const ShardOwnership* ownership = nullptr;
  memory::Device* device = nullptr;  // the engine's: gradients and parameters live there
  std::vector<UpdateTensor> tensors;  // per layout tensor
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // bounds every wait (EngineOptions.timeout)
  comm::Communicator* shard = nullptr;  // the group the layout's chunks are cut over (Muon's exchange)
};

class UpdateApplier {
 public:
  virtual ~UpdateApplier() = default;
  // One optimizer step over every bucket's owned range with the reduced gradients times
  // `grad_scale`, each bucket's new values (in its dtype) handed to `writeback` in bucket order
  // (owned_out, publish), then writeback.finish().
  virtual void apply(const GradReducer& grads, float grad_scale, ParamWriteback& writeback) = 0;
  virtual ShardOptimizer& optimizer() = 0;

  // Checkpoints: optimizer-space elements [begin, begin + n) of the fp32 master, to or from host
  // memory (synchronous).
  virtual void read_master(size_t begin, size_t n, float* out) = 0;
  // The master itself when the host can read and write it (host memory), else nullptr.
  virtual float* host_master() = 0;
  virtual void write_master(size_t begin, size_t n, const float* in) = 0;
  // Every bucket's owned master rounded to its dtype, through `writeback` (after a load: the
  // parameters then hold exactly what the last step wrote).
  virtual void publish_master(ParamWriteback& writeback) = 0;
};

// The optimizer's segments for the rank's owned pieces (optimizer-space order). A segment's matrix
// shape is the whole tensor's where its group's optimizer updates split tensors whole (Muon unless
// muon.per_part), else the registered part's.
std::vector<optim::Segment> optimizer_segments(const ShardOwnership& ownership, const std::vector<UpdateTensor>& tensors,
                                               const optim::OptimizerOptions& options);

// What the optimizer shares with the shard group's other ranks: the exchange of `in`'s tensors in
// Muon groups (zero/matrix_exchange.h, its buffers from `host`, where the optimizer runs) and the
// statistics of those in Adafactor groups (zero/adafactor_stats.h); each null when no group runs
// that kind. A tensor split across ranks by a finalizer is updated as the whole tensor: Muon
// orthogonalizes it gathered whole (unless its group's muon.per_part), Adafactor sums its statistics
// over the parts. InvalidArgument naming the parameter for one they cannot update: Muon's with fewer
// than two dimensions, a split one whose group cannot take host memory.
struct OwnedExchanges {
  std::unique_ptr<MatrixExchange> matrices;
  std::unique_ptr<AdafactorStats> adafactor;
  OptimizerExchanges view() const { return {matrices.get(), adafactor.get()}; }
};
OwnedExchanges make_optimizer_exchanges(const ApplierInputs& in, memory::Device& host);

// Master and state on `in.device`, the optimizer stepping on its compute stream.
std::unique_ptr<UpdateApplier> make_device_applier(const ApplierInputs& in);

}  // namespace zero
