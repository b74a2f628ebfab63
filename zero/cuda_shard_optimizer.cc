// CUDA builds: the optimizer over GPU memory (optim/cuda/cuda_optimizer.h), its state allocated
// through the engine's device so that its tracker accounts for it.
#include <vector>

#include "base/check.h"
#include "optim/cuda/cuda_optimizer.h"
#include "zero/shard_optimizer.h"

namespace zero {
namespace {

class CudaShardOptimizer final : public ShardOptimizer {
 public:
  CudaShardOptimizer(memory::Device& device, const optim::OptimizerOptions& options, size_t numel,
                     std::vector<optim::Segment> segments, std::chrono::milliseconds timeout)
      : ShardOptimizer(device, numel, timeout),
        opt_(options, numel, std::move(segments),
             [this](size_t bytes, const std::string&) {
               state_.push_back(device_.allocate(bytes, memory::Category::kOptimizerState));
               return state_.back().data();
             },
             device.native_handle(device.compute_stream())) {}

  void begin_step() override { opt_.begin_step(); }
  void step_range(const optim::StepInput& in, size_t begin, size_t end, memory::Stream& stream) override {
    opt_.step_range(in, begin, end, device_.native_handle(stream));
  }
  int64_t step_count() const override { return opt_.step_count(); }
  void set_step_count(int64_t steps) override { opt_.set_step_count(steps); }
  optim::Hyper& group(int i) override { return opt_.group(i); }
  std::vector<std::string> state_names() const override { return opt_.state_names(); }
  DType state_dtype() const override { return opt_.state_dtype(); }
  optim::Optimizer* host_optimizer() override { return nullptr; }

 private:
  void* state_data(const std::string& name) override { return opt_.state_data(name); }
  std::vector<memory::Buffer> state_;  // declared before opt_: the allocator fills it during construction
  optim::cuda::CudaOptimizer opt_;
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_cuda_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                          size_t numel, std::vector<optim::Segment> segments,
                                                          std::chrono::milliseconds timeout) {
  return std::make_unique<CudaShardOptimizer>(device, options, numel, std::move(segments), timeout);
}

}  // namespace zero
