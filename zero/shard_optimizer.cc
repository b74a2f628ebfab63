#include "zero/shard_optimizer.h"

#include "base/check.h"

namespace zero {
namespace {

// The options with the state's bytes accounted in the device's tracker.
optim::OptimizerOptions accounted_in(memory::Device& device, optim::OptimizerOptions options) {
  options.tracker = &device.tracker();
  return options;
}

// optim::Optimizer over host memory. The host device's compute stream is the calling thread, so
// the step runs right here, in stream order.
class HostShardOptimizer final : public ShardOptimizer {
 public:
  HostShardOptimizer(memory::Device& device, optim::OptimizerOptions options, size_t numel,
                     std::vector<optim::Segment> segments)
      : device_(device), opt_(accounted_in(device, std::move(options)), numel, std::move(segments)) {}

  void begin_step() override { opt_.begin_step(); }
  void step_range(const optim::StepInput& in, size_t begin, size_t end, memory::Stream& stream) override {
    ZERO_CHECK(&stream == &device_.compute_stream(), "the CPU optimizer runs on the compute stream");
    opt_.step_range(in, begin, end);
  }
  int64_t step_count() const override { return opt_.step_count(); }
  optim::Hyper& group(int i) override { return opt_.group(i); }
  std::vector<std::string> state_names() const override { return opt_.state_names(); }
  DType state_dtype() const override { return opt_.state_dtype(); }
  optim::Optimizer* host_optimizer() override { return &opt_; }

 private:
  memory::Device& device_;
  optim::Optimizer opt_;
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_cuda_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                          size_t numel, std::vector<optim::Segment> segments);

std::unique_ptr<ShardOptimizer> make_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                     size_t numel, std::vector<optim::Segment> segments) {
  if (device.kind() == memory::DeviceKind::kCuda) {
    return make_cuda_shard_optimizer(device, std::move(options), numel, std::move(segments));
  }
  return std::make_unique<HostShardOptimizer>(device, std::move(options), numel, std::move(segments));
}

}  // namespace zero
