// 8-bit AdamW over a rank's elements of the groups that run it (optim/adamw8bit.h), in host memory:
// a byte per element and moment, an fp32 absmax per block and moment. The grouped optimizer hands it
// its kind's elements packed back to back; every piece starts on a block of its tensor, because the
// stage policy starts each quantized tensor on a layout block, which is a multiple of the
// quantization block, and rank chunks and buckets are cut on layout blocks. So a block never spans
// two ranks or two buckets, and the state is the same at every stage and world size.
//
// Checkpoints see four fp32 states per element: the dequantized moments ("exp_avg", "exp_avg_sq")
// and each block's absmax repeated on its elements ("exp_avg_absmax", "exp_avg_sq_absmax"). From
// those the codes come back exactly: map[c] * absmax / absmax is within an ulp of map[c], and the
// map's entries are percent apart. The file stores them at their own size (state_encoding below:
// the codes and a scale per block, each absmax once per block). Writes are held until the next step (or read) and quantized
// then, so that the states may be written in any order; moments written without an absmax, or with
// a zero one (fp32 AdamW state converted on load), are quantized with their blocks' own absmax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "memory/meta_device.h"
#include "optim/adamw8bit.h"
#include "optim/dynamic_quantization.h"
#include "optim/optimizer_checks.h"
#include "optim/step_schedule.h"
#include "optim/thread_pool.h"
#include "optim/step_coeffs.h"
#include "zero/optimizer_runs.h"
#include "zero/shard_optimizer.h"

namespace zero {
namespace {

constexpr const char* kValueNames[2] = {"exp_avg", "exp_avg_sq"};
constexpr const char* kAbsmaxNames[2] = {"exp_avg_absmax", "exp_avg_sq_absmax"};

// A segment's elements [begin, end) and its blocks from first_block on.
struct Run {
  size_t begin = 0, end = 0, first_block = 0;
  int group = 0;
};

class AdamW8bitShardOptimizer final : public ShardOptimizer {
 public:
  AdamW8bitShardOptimizer(memory::Device& device, optim::OptimizerOptions options, size_t numel,
                          std::vector<optim::Segment> segments, std::chrono::milliseconds timeout)
      : ShardOptimizer(device, numel, timeout), options_(std::move(options)), numel_(numel),
        meta_(dynamic_cast<memory::MetaDevice*>(&device) != nullptr), block_(options_.quant_block) {
    optim::detail::validate_common_options(options_);
    optim::detail::validate_segments(segments, numel, static_cast<int>(options_.groups.size()));
    if (!meta_ && device.kind() == memory::DeviceKind::kCuda) {
      ZERO_THROW(InvalidArgument, "optimizer: 8-bit AdamW runs in host memory; on {} set offload.optimizer", device.name());
    }
    std::sort(segments.begin(), segments.end(),
              [](const optim::Segment& a, const optim::Segment& b) { return a.begin < b.begin; });
    size_t blocks = 0;
    for (const optim::Segment& s : segments) {
      if (s.param_name.empty() || s.end == s.begin) continue;
      if (s.param_offset % block_ != 0) {
        ZERO_THROW(InvalidArgument,
                   "parameter '{}': this rank's elements start at {}, inside an 8-bit block of {} (layout.block must "
                   "be a multiple of optimizer.quant_block)", s.param_name, s.param_offset, block_);
      }
      runs_.push_back({s.begin, s.end, blocks, s.group});
      blocks += (s.end - s.begin + block_ - 1) / block_;
    }
    num_blocks_ = blocks;
    for (int k = 0; k < 2; ++k) {
      codes_[k] = device.allocate_elements(static_cast<int64_t>(numel), DType::kUInt8, memory::Category::kOptimizerState);
      absmax_[k] = device.allocate_elements(static_cast<int64_t>(blocks), DType::kFloat32, memory::Category::kOptimizerState);
      if (meta_) continue;
      std::memset(codes_[k].data(), 0, numel);  // with absmax 0 every code reads 0
      std::memset(absmax_[k].data(), 0, blocks * sizeof(float));
    }
  }

  void begin_step() override {
    optim::validate_groups(options_);
    settle_writes();
    ++steps_;
    coeffs_.clear();
    for (const optim::Hyper& h : options_.groups) {
      coeffs_.push_back(optim::compute_step_coeffs(optim::OptimizerKind::kAdamW8bit, h, steps_, 1.0f, false));
    }
  }

  void step_range(const optim::StepInput& in, size_t begin, size_t end, memory::Stream&) override {
    if (meta_) return;
    // The range's pieces, each split on block boundaries into about num_threads equal shares.
    struct Share {
      const Run* run;
      size_t lo, hi;
    };
    std::vector<Share> shares;
    const size_t threads = static_cast<size_t>(pool_.size());
    const size_t target = std::max(block_, ((end - begin) / threads + block_ - 1) / block_ * block_);
    for_each_overlap(runs_, begin, end, [&](const Run& r, size_t lo, size_t hi) {
      ZERO_CHECK((lo - r.begin) % block_ == 0 && (hi == r.end || (hi - r.begin) % block_ == 0),
                 "8-bit AdamW: range [{}, {}) cuts a block", begin, end);
      for (size_t at = lo; at < hi; at += target) shares.push_back({&r, at, std::min(hi, at + target)});
    });
    const size_t grad_size = dtype_size(in.grad_dtype), out_size = dtype_size(in.model_dtype);
    const SimdPath path = options_.simd_path.value_or(best_simd_path());
    const auto step_share = [&](const Share& s) {
      const size_t at = s.lo - begin;
      optim::StepInput sub = in;
      sub.master = in.master + at;
      sub.grad = static_cast<const char*>(in.grad) + at * grad_size;
      sub.model_out = in.model_out ? static_cast<char*>(in.model_out) + at * out_size : nullptr;
      optim::StepCoeffs c = coeffs_[static_cast<size_t>(s.run->group)];
      c.grad_scale = in.grad_scale;
      const size_t b = s.run->first_block + (s.lo - s.run->begin) / block_;
      optim::adamw8bit_step(sub, s.hi - s.lo, block_, c, moment(0, s.lo, b), moment(1, s.lo, b), path);
    };
    // Shares in turn: thread i takes shares i, i + threads, ... (each share's result is the same
    // whichever thread runs it).
    pool_.run([&](int i) {
      for (size_t k = static_cast<size_t>(i); k < shares.size(); k += threads) step_share(shares[k]);
    });
  }

  int64_t step_count() const override { return steps_; }
  void set_step_count(int64_t steps) override { steps_ = steps; }
  optim::Hyper& group(int i) override { return optim::detail::group_at(options_, i); }
  std::vector<std::string> state_names() const override { return optim::optimizer_state_names(optim::OptimizerKind::kAdamW8bit); }
  DType state_dtype() const override { return DType::kUInt8; }
  optim::Optimizer* host_optimizer() override { return nullptr; }
  float* host_state(const std::string&) override { return nullptr; }
  double state_bytes_per_element() const override {
    return numel_ == 0 ? 0.0 : static_cast<double>(2 * numel_ + 2 * sizeof(float) * num_blocks_) / static_cast<double>(numel_);
  }

  // A checkpoint stores each moment as its codes and its blocks' absmax, and each absmax once per
  // block: about a byte per element and moment (the pieces of tensors kept in fp32 stay fp32).
  StateEncoding state_encoding(const std::string& name, size_t, size_t) const override {
    for (int k = 0; k < 2; ++k) {
      if (name == kValueNames[k]) {
        return {.kind = StateEncoding::Kind::kDynamic8, .block = block_, .is_signed = k == 0, .scale_state = kAbsmaxNames[k]};
      }
      if (name == kAbsmaxNames[k]) return {.kind = StateEncoding::Kind::kBlockConstant, .block = block_};
    }
    return {};
  }

  void read_state(const std::string& name, size_t begin, size_t n, float* out) override {
    const auto [k, absmax] = state_of(name, begin, n, "read_state");
    settle_writes();
    read_kept(k, absmax, begin, n, out);
  }

  void write_state(const std::string& name, size_t begin, size_t n, const float* in) override {
    const auto [k, absmax] = state_of(name, begin, n, "write_state");
    if (meta_) return;
    std::vector<float>& held = absmax ? held_absmax_[k] : held_values_[k];
    if (held.empty()) {  // unwritten elements keep what they hold
      held.resize(numel_);
      read_kept(k, absmax, 0, numel_, held.data());
    }
    std::memcpy(held.data() + begin, in, n * sizeof(float));
  }

 private:
  // Moment k's kept values (or absmax per element) of [begin, begin + n); zeros outside the runs.
  void read_kept(int k, bool absmax, size_t begin, size_t n, float* out) {
    std::fill(out, out + n, 0.0f);
    if (meta_) return;
    const optim::DynamicMap& map = optim::dynamic_map(k == 0);
    for_each_overlap(runs_, begin, begin + n, [&](const Run& r, size_t lo, size_t hi) {
      for (size_t e = lo; e < hi; ++e) {
        const float a = absmax_[k].as<float>()[r.first_block + (e - r.begin) / block_];
        out[e - begin] = absmax ? a : map.values[codes_[k].as<uint8_t>()[e]] * a;
      }
    });
  }

  optim::QuantizedMoment moment(int k, size_t element, size_t block) {
    return {codes_[k].as<uint8_t>() + element, absmax_[k].as<float>() + block};
  }

  // Which moment `name` is, and whether it is the absmax; throws for another name or a bad range.
  std::pair<int, bool> state_of(const std::string& name, size_t begin, size_t n, const char* what) const {
    check_range(name, begin, n, what);
    for (int k = 0; k < 2; ++k) {
      if (name == kValueNames[k]) return {k, false};
      if (name == kAbsmaxNames[k]) return {k, true};
    }
    ZERO_THROW(InvalidArgument, "unknown optimizer state '{}' (adamw8bit keeps {})", name, fmt::join(state_names(), ", "));
  }

  // Quantizes what write_state held: each block with the absmax written for it (its first
  // element's), or without one, with its own absmax.
  void settle_writes() {
    for (int k = 0; k < 2; ++k) {
      if (held_values_[k].empty() && held_absmax_[k].empty()) continue;
      std::vector<float> values = std::move(held_values_[k]), absmax = std::move(held_absmax_[k]);
      held_values_[k].clear();
      held_absmax_[k].clear();
      const optim::DynamicMap& map = optim::dynamic_map(k == 0);
      for (const Run& r : runs_) {
        for (size_t at = r.begin, b = r.first_block; at < r.end; at += block_, ++b) {
          const size_t len = std::min(block_, r.end - at);
          float& a = absmax_[k].as<float>()[b];
          uint8_t* codes = codes_[k].as<uint8_t>() + at;
          if (values.empty()) {
            a = absmax[at];  // the codes stay
          } else if (absmax.empty() || absmax[at] == 0.0f) {
            // No absmax given (or zero, which a load that starts the absmax anew writes): the block's own.
            a = optim::quantize_block(map, values.data() + at, len, codes);
          } else {
            a = absmax[at];
            optim::quantize_with(map, values.data() + at, len, a, codes);
          }
        }
      }
    }
  }

  void* state_data(const std::string& name) override {
    ZERO_THROW(InvalidArgument, "optimizer state '{}' has no fp32 array: adamw8bit keeps it in 8 bits per block", name);
  }

  optim::OptimizerOptions options_;
  size_t numel_;
  bool meta_;
  size_t block_;
  size_t num_blocks_ = 0;
  std::vector<Run> runs_;  // by begin
  memory::Buffer codes_[2], absmax_[2];
  std::vector<float> held_values_[2], held_absmax_[2];  // written, not yet quantized (checkpoint load)
  std::vector<optim::StepCoeffs> coeffs_;               // per group, this step's
  int64_t steps_ = 0;
  optim::ThreadPool pool_{std::max(1, options_.num_threads)};  // (num_threads is validated above)
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_adamw8bit_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                               size_t numel, std::vector<optim::Segment> segments,
                                                               std::chrono::milliseconds timeout) {
  return std::make_unique<AdamW8bitShardOptimizer>(device, std::move(options), numel, std::move(segments), timeout);
}

}  // namespace zero
