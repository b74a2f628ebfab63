// The engine's side of a user's update rule (optim/custom_optimizer.h): the state arrays allocated
// through the device (category optimizer_state, so the memory report, the planner and checkpoints see
// them), the gradient widened to fp32 and scaled, the rule called per owned parameter range, the new
// master weights written out in the model's dtype. Host memory only: the host device's compute
// stream is the calling thread, so everything runs right here, in stream order.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/check.h"
#include "memory/host_kernels.h"
#include "optim/custom_optimizer.h"
#include "optim/optimizer_checks.h"
#include "zero/shard_optimizer.h"

namespace zero {
namespace {

class CustomShardOptimizer final : public ShardOptimizer {
 public:
  CustomShardOptimizer(memory::Device& device, optim::OptimizerOptions options, size_t numel,
                       std::vector<optim::Segment> segments, std::chrono::milliseconds timeout)
      : ShardOptimizer(device, numel, timeout), options_(std::move(options)), rule_(*options_.custom),
        names_(rule_.state_names()), segments_(std::move(segments)) {
    if (options_.state_dtype != DType::kFloat32) {
      ZERO_THROW(InvalidArgument, "optimizer.state_dtype: the custom optimizer '{}' keeps fp32 state, got {}",
                 rule_.name(), dtype_name(options_.state_dtype));
    }
    for (size_t i = 0; i < names_.size(); ++i) {
      if (names_[i].empty() || std::count(names_.begin(), names_.end(), names_[i]) > 1) {
        ZERO_THROW(InvalidArgument, "the custom optimizer '{}': state_names()[{}] '{}' is empty or repeated", rule_.name(),
                   i, names_[i]);
      }
    }
    optim::validate_groups(options_);
    optim::detail::validate_segments(segments_, numel, static_cast<int>(options_.groups.size()));
    // The layout's promise to a per-tensor rule (ShardLayoutOptions.whole_tensors): no piece starts
    // inside a tensor, so each update() call holds a whole one.
    for (const optim::Segment& s : segments_) {
      ZERO_CHECK(!rule_.needs_whole_tensors() || s.param_name.empty() || s.param_offset == 0,
                 "'{}' needs whole tensors but parameter '{}' is cut at element {}", rule_.name(), s.param_name,
                 s.param_offset);
    }
    std::sort(segments_.begin(), segments_.end(),
              [](const optim::Segment& a, const optim::Segment& b) { return a.begin < b.begin; });
    for (size_t i = 0; i < names_.size(); ++i) {
      state_.push_back(device.allocate_elements(static_cast<int64_t>(numel), DType::kFloat32,
                                                memory::Category::kOptimizerState));
      std::memset(state_.back().data(), 0, numel * sizeof(float));
    }
    pointers_.resize(names_.size());
  }

  void begin_step() override {
    optim::validate_groups(options_);  // a schedule may have set them since
    ++steps_;
  }

  void step_range(const optim::StepInput& in, size_t begin, size_t end, memory::Stream& stream) override {
    ZERO_CHECK(&stream == &device_.compute_stream(), "a custom optimizer runs on the compute stream");
    const optim::UpdateContext context{.step = steps_, .groups = options_.groups};
    const size_t model_size = dtype_size(in.model_dtype);
    auto first = std::upper_bound(segments_.begin(), segments_.end(), begin,
                                  [](size_t b, const optim::Segment& s) { return b < s.end; });
    for (auto s = first; s != segments_.end() && s->begin < end; ++s) {
      if (s->param_name.empty()) continue;  // padding
      const size_t lo = std::max(s->begin, begin), hi = std::min(s->end, end), n = hi - lo, at = lo - begin;
      scaled_fp32_grad(in, at, n, grad_);
      for (size_t k = 0; k < state_.size(); ++k) pointers_[k] = static_cast<float*>(state_[k].data()) + lo;
      float* master = in.master + at;
      if (rule_.needs_whole_tensors() && s->whole) {
        // A slice of a tensor held across ranks: the rule updates the whole one, this rank keeps its slice.
        std::vector<float*> local{master, grad_.data()};
        local.insert(local.end(), pointers_.begin(), pointers_.end());
        s->whole(local, n, [&](std::span<float* const> whole, size_t whole_numel) {
          rule_.update(context, {.param = s->param_name, .param_offset = 0, .numel = whole_numel, .group = s->group,
                                 .master = whole[0], .grad = whole[1], .state = whole.subspan(2)});
        });
      } else {
        rule_.update(context, {.param = s->param_name, .param_offset = s->param_offset + (lo - s->begin), .numel = n,
                               .group = s->group, .master = master, .grad = grad_.data(), .state = pointers_});
      }
      if (in.model_out != nullptr) {
        void* out = static_cast<char*>(in.model_out) + at * model_size;
        if (out != master) memory::host_kernels::convert(master, DType::kFloat32, out, in.model_dtype, n);
      }
    }
  }

  int64_t step_count() const override { return steps_; }
  void set_step_count(int64_t steps) override { steps_ = steps; }
  optim::Hyper& group(int i) override { return options_.groups.at(static_cast<size_t>(i)); }
  std::vector<std::string> state_names() const override { return names_; }
  DType state_dtype() const override { return DType::kFloat32; }
  optim::Optimizer* host_optimizer() override { return nullptr; }

 private:
  void* state_data(const std::string& name) override {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (names_[i] == name) return state_[i].data();
    }
    ZERO_THROW(InvalidArgument, "unknown optimizer state '{}' (the custom optimizer '{}' keeps {})", name,
               rule_.name(), fmt::join(names_, ", "));
  }

  optim::OptimizerOptions options_;
  optim::CustomOptimizer& rule_;  // owned by options_.custom
  std::vector<std::string> names_;
  std::vector<optim::Segment> segments_;  // by begin
  std::vector<memory::Buffer> state_;
  std::vector<float*> pointers_;  // the state at the current range
  std::vector<float> grad_;       // the current range's fp32 gradient
  int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_custom_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                            size_t numel, std::vector<optim::Segment> segments,
                                                            std::chrono::milliseconds timeout) {
  if (device.kind() == memory::DeviceKind::kCuda) {
    ZERO_THROW(InvalidArgument,
               "optimizer.custom: '{}' runs on the host; on {} set offload.optimizer, which keeps the master weights "
               "and the optimizer state in host memory",
               options.custom->name(), device.name());
  }
  return std::make_unique<CustomShardOptimizer>(device, std::move(options), numel, std::move(segments), timeout);
}

}  // namespace zero
