// CPU builds: there is no CUDA optimizer to make.
#include "base/check.h"
#include "zero/shard_optimizer.h"

namespace zero {

std::unique_ptr<ShardOptimizer> make_cuda_shard_optimizer(memory::Device& device, optim::OptimizerOptions,
                                                          size_t, std::vector<optim::Segment>) {
  ZERO_THROW(InvalidArgument, "device '{}' holds CUDA memory but this build has no CUDA (build with --config=cuda)",
             device.name());
}

}  // namespace zero
