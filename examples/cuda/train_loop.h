#pragma once
// The CUDA MLP's training loop, shared by the example program (train_mlp_cuda) and its test: the
// examples' synthetic data, the engine on a CUDA device with the NCCL communicator, each layer a
// unit (its gather scope around its forward and backward, as on the host), the loss read back once
// per step.
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "zero/engine.h"
#include "zero/memory_report.h"

namespace zero::examples::cuda {

struct CudaMlpRun {
  std::vector<int> widths = {64, 256, 256, 10};
  int global_batch = 64;  // samples per micro-step over all ranks
  int steps = 20;
  int seed = 1;
  int device = 0;         // the GPU ordinal
};

struct CudaMlpStep {
  int step = 0;           // 1-based
  double loss = 0;        // mean over micro-steps and ranks
  double grad_norm = 0;
  double seconds = 0;     // the step's wall time, loss read-back included
};

// The examples' MLP options (as examples/train_mlp.cc's): AdamW, weight decay on the matrices only
// (group 1 holds the biases), clipping at 1.
inline EngineOptions cuda_mlp_options(int stage, int micro) {
  EngineOptions o;
  o.stage = stage;
  o.optimizer.kind = optim::OptimizerKind::kAdamW;
  o.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f},
                        optim::Hyper{.lr = 1e-2f, .weight_decay = 0.0f}};
  o.max_grad_norm = 1.0f;
  o.micro_batches = micro;
  o.layout.bucket_numel = 64 * 1024;
  return o;
}

// Trains with `options` (its stage, optimizer, micro-steps) over `nccl` (a CUDA communicator; the
// data is split by its rank) and `host` (for the loss's mean over ranks); calls on_step after every
// step on every rank. Returns the engine's memory report.
MemoryReport train_cuda_mlp(comm::Communicator& nccl, comm::Communicator& host, const EngineOptions& options,
                            const CudaMlpRun& run, const std::function<void(const CudaMlpStep&)>& on_step);

}  // namespace zero::examples::cuda
