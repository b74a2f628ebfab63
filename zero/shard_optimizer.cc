#include "zero/shard_optimizer.h"

#include <chrono>

#include "base/check.h"
#include "memory/host_kernels.h"
#include "memory/meta_device.h"

namespace zero {

void ShardOptimizer::check_range(const std::string& name, size_t begin, size_t n, const char* what) const {
  if (begin > numel_ || n > numel_ - begin) {
    ZERO_THROW(InvalidArgument, "{}('{}'): elements [{}, {}) are past the optimizer space's {}", what, name, begin,
               begin + n, numel_);
  }
}

void* ShardOptimizer::checked_range(const std::string& name, size_t begin, size_t n, const char* what) {
  check_range(name, begin, n, what);
  return static_cast<char*>(state_data(name)) + begin * dtype_size(state_dtype());
}

void ShardOptimizer::read_state(const std::string& name, size_t begin, size_t n, float* out) {
  const void* src = checked_range(name, begin, n, "read_state");
  memory::Stream& compute = device_.compute_stream();
  if (state_dtype() == DType::kFloat32) {
    device_.copy(out, src, n * sizeof(float), compute);
    device_.synchronize(compute, timeout_);
    return;
  }
  std::vector<char> narrow(n * dtype_size(state_dtype()));
  device_.copy(narrow.data(), src, narrow.size(), compute);
  device_.synchronize(compute, timeout_);
  memory::host_kernels::convert(narrow.data(), state_dtype(), out, DType::kFloat32, n);
}

void ShardOptimizer::write_state(const std::string& name, size_t begin, size_t n, const float* in) {
  void* dst = checked_range(name, begin, n, "write_state");
  memory::Stream& compute = device_.compute_stream();
  if (state_dtype() == DType::kFloat32) {
    device_.copy(dst, in, n * sizeof(float), compute);
    device_.synchronize(compute, timeout_);
    return;
  }
  std::vector<char> narrow(n * dtype_size(state_dtype()));
  memory::host_kernels::convert(in, DType::kFloat32, narrow.data(), state_dtype(), n);
  device_.copy(dst, narrow.data(), narrow.size(), compute);
  device_.synchronize(compute, timeout_);  // `narrow` is read until here
}

const float* scaled_fp32_grad(const optim::StepInput& in, size_t at, size_t n, std::vector<float>& scratch) {
  if (scratch.size() < n) scratch.resize(n);
  memory::host_kernels::convert(static_cast<const char*>(in.grad) + at * dtype_size(in.grad_dtype), in.grad_dtype,
                                scratch.data(), DType::kFloat32, n);
  if (in.grad_scale != 1.0f) {
    for (size_t i = 0; i < n; ++i) scratch[i] *= in.grad_scale;
  }
  return scratch.data();
}

StateEncoding ShardOptimizer::state_encoding(const std::string&, size_t, size_t) const { return {}; }

double ShardOptimizer::state_bytes_per_element() const {
  return static_cast<double>(state_names().size() * dtype_size(state_dtype()));
}

float* ShardOptimizer::host_state(const std::string& name) {
  if (device_.kind() == memory::DeviceKind::kCuda || state_dtype() != DType::kFloat32) return nullptr;
  return static_cast<float*>(state_data(name));
}

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
                     std::vector<optim::Segment> segments, std::chrono::milliseconds timeout)
      : ShardOptimizer(device, numel, timeout), opt_(accounted_in(device, std::move(options)), numel, std::move(segments)) {}

  void begin_step() override { opt_.begin_step(); }
  void step_range(const optim::StepInput& in, size_t begin, size_t end, memory::Stream& stream) override {
    ZERO_CHECK(&stream == &device_.compute_stream(), "the CPU optimizer runs on the compute stream");
    opt_.step_range(in, begin, end);
  }
  int64_t step_count() const override { return opt_.step_count(); }
  void set_step_count(int64_t steps) override { opt_.set_step_count(steps); }
  optim::Hyper& group(int i) override { return opt_.group(i); }
  std::vector<std::string> state_names() const override { return opt_.state_names(); }
  DType state_dtype() const override { return opt_.state_dtype(); }
  optim::Optimizer* host_optimizer() override { return &opt_; }

 private:
  void* state_data(const std::string& name) override { return opt_.state_data(name); }
  optim::Optimizer opt_;
};

// The planner's optimizer, on a meta device: its state allocated through the device as the real
// optimizers allocate theirs (each state numel elements of state_dtype, category optimizer_state),
// nothing computed.
class PlanningShardOptimizer final : public ShardOptimizer {
 public:
  PlanningShardOptimizer(memory::Device& device, const optim::OptimizerOptions& options, size_t numel,
                         std::chrono::milliseconds timeout)
      : ShardOptimizer(device, numel, timeout), options_(options), names_(optim::optimizer_state_names(options)) {
    for (size_t i = 0; i < names_.size(); ++i) {
      state_.push_back(device.allocate_elements(static_cast<int64_t>(numel), options.state_dtype,
                                                memory::Category::kOptimizerState));
    }
  }
  void begin_step() override { ++steps_; }
  void step_range(const optim::StepInput&, size_t, size_t, memory::Stream&) override {}
  int64_t step_count() const override { return steps_; }
  void set_step_count(int64_t steps) override { steps_ = steps; }
  optim::Hyper& group(int i) override { return options_.groups.at(static_cast<size_t>(i)); }
  std::vector<std::string> state_names() const override { return names_; }
  DType state_dtype() const override { return options_.state_dtype; }
  optim::Optimizer* host_optimizer() override { return nullptr; }

 private:
  void* state_data(const std::string& name) override {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (names_[i] == name) return state_[i].data();
    }
    ZERO_THROW(InvalidArgument, "unknown optimizer state '{}'", name);
  }
  optim::OptimizerOptions options_;
  std::vector<std::string> names_;
  std::vector<memory::Buffer> state_;
  int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_cuda_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                          size_t numel, std::vector<optim::Segment> segments,
                                                          std::chrono::milliseconds timeout);

std::unique_ptr<ShardOptimizer> make_custom_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                            size_t numel, std::vector<optim::Segment> segments,
                                                            std::chrono::milliseconds timeout);

std::unique_ptr<ShardOptimizer> make_grouped_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                             size_t numel, std::vector<optim::Segment> segments,
                                                             std::chrono::milliseconds timeout, OptimizerExchanges exchanges);

std::unique_ptr<ShardOptimizer> make_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                     size_t numel, std::vector<optim::Segment> segments,
                                                     std::chrono::milliseconds timeout, OptimizerExchanges exchanges) {
  const std::vector<optim::OptimizerKind> kinds = optim::group_kinds(options);
  if (!options.custom && (kinds.size() > 1 || !optim::is_elementwise(kinds.front()))) {
    return make_grouped_shard_optimizer(device, std::move(options), numel, std::move(segments), timeout, exchanges);
  }
  if (!options.custom) options.kind = kinds.front();  // every group's, set on the groups themselves
  if (dynamic_cast<memory::MetaDevice*>(&device) != nullptr) {
    return std::make_unique<PlanningShardOptimizer>(device, options, numel, timeout);
  }
  if (options.custom) {
    return make_custom_shard_optimizer(device, std::move(options), numel, std::move(segments), timeout);
  }
  if (device.kind() == memory::DeviceKind::kCuda) {
    return make_cuda_shard_optimizer(device, std::move(options), numel, std::move(segments), timeout);
  }
  return std::make_unique<HostShardOptimizer>(device, std::move(options), numel, std::move(segments), timeout);
}

}  // namespace zero
