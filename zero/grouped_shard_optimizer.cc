// The optimizer of an engine whose parameter groups run different kinds (Muon for the matrices and
// AdamW for the rest, Moonlight's recipe; or AdamW and SGD side by side). Each elementwise kind gets
// its own optimizer (make_shard_optimizer: the SIMD CPU one, the CUDA one, the planner's) over a
// space of its own elements only, packed back to back, so every element keeps only its own kind's
// state: the hybrid's state is 4 bytes per Muon element and 8 per AdamW element, not the union of
// both everywhere. 8-bit AdamW has an optimizer of its own (zero/adamw8bit_shard_optimizer.cc), and
// its groups' tensors under quant_min_numel go to fp32 AdamW's; Adafactor's update is its own
// (zero/adafactor_update.h, around the sums zero/adafactor_stats.h reduces). Muon's update runs
// here, around the matrix exchange:
//
//   momentum  m = mu m + g;  u = nesterov ? g + mu m : m          (this rank's elements, fp32)
//   exchange  u -> the orthogonalized update O, whole matrix by whole matrix (zero/matrix_exchange.h)
//   apply     W = W (1 - lr wd) - lr rms_scale sqrt(max(rows, cols)) O, then the model's copy
//
// Where the shard group exchanges, the momentum runs in prepare_range (every bucket's, before any
// update: the exchange balances the whole step's matrices over the ranks), the exchange at the
// step's first bucket with matrices, and the rest in step_range; else all three bucket by bucket.
//
// Checkpoints address the state by optimizer-space element as for one kind: an element reads zeros
// for the states its kind does not keep, and writes to them are dropped.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "memory/host_kernels.h"
#include "memory/meta_device.h"
#include "optim/optimizer_checks.h"
#include "optim/step_coeffs.h"
#include "optim/step_schedule.h"
#include "zero/adafactor_update.h"
#include "zero/optimizer_runs.h"
#include "zero/shard_optimizer.h"

namespace zero {

std::unique_ptr<ShardOptimizer> make_adamw8bit_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                               size_t numel, std::vector<optim::Segment> segments,
                                                               std::chrono::milliseconds timeout);

namespace {

// A segment of one kind: optimizer-space elements [begin, end), at `packed` in that kind's space.
struct Run {
  size_t begin = 0, end = 0, packed = 0;
  const optim::Segment* segment = nullptr;
};

class GroupedShardOptimizer final : public ShardOptimizer {
 public:
  GroupedShardOptimizer(memory::Device& device, optim::OptimizerOptions options, size_t numel,
                        std::vector<optim::Segment> segments, std::chrono::milliseconds timeout,
                        OptimizerExchanges exchanges)
      : ShardOptimizer(device, numel, timeout), options_(std::move(options)), segments_(std::move(segments)),
        matrices_(exchanges.matrices), meta_(dynamic_cast<memory::MetaDevice*>(&device) != nullptr) {
    optim::detail::validate_common_options(options_);
    optim::detail::validate_segments(segments_, numel, static_cast<int>(options_.groups.size()));
    names_ = optim::optimizer_state_names(options_);
    std::sort(segments_.begin(), segments_.end(),
              [](const optim::Segment& a, const optim::Segment& b) { return a.begin < b.begin; });
    std::vector<optim::OptimizerKind> kinds = optim::group_kinds(options_);
    // 8-bit AdamW's small tensors run fp32 AdamW (optim::tensor_kind).
    if (std::count(kinds.begin(), kinds.end(), optim::OptimizerKind::kAdamW8bit) &&
        !std::count(kinds.begin(), kinds.end(), optim::OptimizerKind::kAdamW)) {
      kinds.push_back(optim::OptimizerKind::kAdamW);
    }
    if (exchanges.adafactor != nullptr) {
      // Every rank of the shard group takes part in Adafactor's sums, whether it holds its elements or not.
      std::vector<const optim::Segment*> own;
      for (const optim::Segment& s : segments_) {
        if (!s.param_name.empty() && s.end > s.begin && element_kind(s) == optim::OptimizerKind::kAdafactor) own.push_back(&s);
      }
      adafactor_ = std::make_unique<AdafactorUpdate>(device, options_, std::move(own), exchanges.adafactor, meta_);
    }
    for (optim::OptimizerKind kind : kinds) {
      if (kind == optim::OptimizerKind::kAdafactor) {
        ZERO_CHECK(adafactor_ != nullptr || meta_, "Adafactor groups without their statistics");
        continue;
      }
      std::vector<Run> runs;
      std::vector<optim::Segment> own;
      size_t packed = 0;
      for (const optim::Segment& s : segments_) {
        if (s.param_name.empty() || s.end == s.begin || element_kind(s) != kind) continue;
        runs.push_back({s.begin, s.end, packed, &s});
        optim::Segment p = s;
        p.begin = packed;
        p.end = packed + (s.end - s.begin);
        own.push_back(std::move(p));
        packed += s.end - s.begin;
      }
      if (packed == 0) continue;  // a group of this kind without parameters here
      if (kind == optim::OptimizerKind::kMuon) {
        set_up_muon(device, std::move(runs), packed);
        continue;
      }
      Part part{kind, std::move(runs), nullptr, {}};
      part.opt = kind == optim::OptimizerKind::kAdamW8bit
                     ? make_adamw8bit_shard_optimizer(device, options_for(kind), packed, std::move(own), timeout)
                     : make_shard_optimizer(device, options_for(kind), packed, std::move(own), timeout);
      part.states = part.opt->state_names();
      parts_.push_back(std::move(part));
    }
  }

  void begin_step() override {
    optim::validate_groups(options_);  // a schedule may have set them since
    for (Part& part : parts_) {
      for (size_t g = 0; g < options_.groups.size(); ++g) {
        if (serves(part.kind, g)) part.opt->group(static_cast<int>(g)) = own_hyper(g);
      }
      part.opt->begin_step();
    }
    // Muon's scalars per group, in double as Python computes them (step_coeffs.h), once a step.
    muon_scalars_.resize(options_.groups.size());
    for (size_t g = 0; g < options_.groups.size(); ++g) {
      const optim::Hyper& h = options_.groups[g];
      const double lr = optim::decimal_double(h.lr);
      muon_scalars_[g] = {static_cast<float>(1.0 - lr * optim::decimal_double(h.weight_decay)),
                          lr * optim::decimal_double(h.muon.rms_scale)};
    }
    ++steps_;
    if (adafactor_) adafactor_->begin_step(options_, steps_);
    prepared_ = 0;
    exchanged_ = false;
  }

  // The buckets with matrices, where the shard group exchanges them.
  bool prepares(size_t begin) const override {
    return matrices_ != nullptr && !meta_ && matrices_->exchanges() && matrices_->has_matrices(matrices_->bucket_at(begin));
  }

  void prepare_range(const optim::StepInput& in, size_t begin, size_t end) override {
    if (!prepares(begin)) return;
    muon_momentum(in, begin, end, matrices_->input(matrices_->bucket_at(begin)));
    ++prepared_;
  }

  void step_range(const optim::StepInput& in, size_t begin, size_t end, memory::Stream& stream) override {
    if (meta_) return;
    // Every rank calls the collective updates for every bucket, holding elements of them or not.
    if (matrices_ != nullptr) step_muon(in, begin, end);
    if (adafactor_) adafactor_->step(in, begin, end);
    const size_t grad_size = dtype_size(in.grad_dtype), out_size = dtype_size(in.model_dtype);
    for (Part& part : parts_) {
      for_each_overlap(part.runs, begin, end, [&](const Run& r, size_t lo, size_t hi) {
        const size_t at = lo - begin;
        optim::StepInput sub = in;
        sub.master = in.master + at;
        sub.grad = static_cast<const char*>(in.grad) + at * grad_size;
        sub.model_out = in.model_out ? static_cast<char*>(in.model_out) + at * out_size : nullptr;
        sub.master_numel = sub.grad_numel = sub.model_numel = std::nullopt;
        part.opt->step_range(sub, r.packed + (lo - r.begin), r.packed + (hi - r.begin), stream);
      });
    }
  }

  int64_t step_count() const override { return steps_; }
  void set_step_count(int64_t steps) override {
    for (Part& part : parts_) part.opt->set_step_count(steps);
    steps_ = steps;
    if (adafactor_) adafactor_->loaded();
  }
  optim::Hyper& group(int i) override { return optim::detail::group_at(options_, i); }
  std::vector<std::string> state_names() const override { return names_; }
  DType state_dtype() const override { return options_.state_dtype; }
  optim::Optimizer* host_optimizer() override { return nullptr; }

  void read_state(const std::string& name, size_t begin, size_t n, float* out) override {
    check_state(name, begin, n, "read_state");
    std::fill(out, out + n, 0.0f);
    if (adafactor_ && AdafactorUpdate::keeps(name)) adafactor_->read_state(name, begin, n, out);
    for_each_state(name, begin, n, [&](Part* part, const Run& r, size_t lo, size_t hi) {
      float* dst = out + (lo - begin);
      if (part != nullptr) {
        part->opt->read_state(name, r.packed + (lo - r.begin), hi - lo, dst);
      } else {
        std::memcpy(dst, momentum_.as<float>() + r.packed + (lo - r.begin), (hi - lo) * sizeof(float));
      }
    });
  }
  void write_state(const std::string& name, size_t begin, size_t n, const float* in) override {
    check_state(name, begin, n, "write_state");
    if (adafactor_ && AdafactorUpdate::keeps(name)) adafactor_->write_state(name, begin, n, in);
    for_each_state(name, begin, n, [&](Part* part, const Run& r, size_t lo, size_t hi) {
      const float* src = in + (lo - begin);
      if (part != nullptr) {
        part->opt->write_state(name, r.packed + (lo - r.begin), hi - lo, src);
      } else {
        std::memcpy(momentum_.as<float>() + r.packed + (lo - r.begin), src, (hi - lo) * sizeof(float));
      }
    });
  }
  float* host_state(const std::string&) override { return nullptr; }  // no array spans the optimizer space
  // The encoding of the kind that keeps the piece's elements (a piece is one tensor's, so one kind's).
  StateEncoding state_encoding(const std::string& name, size_t begin, size_t n) const override {
    StateEncoding e;
    if (adafactor_ && AdafactorUpdate::keeps(name)) e = adafactor_->state_encoding(name, begin, n);
    if (e.kind != StateEncoding::Kind::kNone) return e;
    for (const Part& part : parts_) {
      if (std::find(part.states.begin(), part.states.end(), name) == part.states.end()) continue;
      for_each_overlap(part.runs, begin, begin + 1, [&](const Run& r, size_t lo, size_t) {
        e = part.opt->state_encoding(name, r.packed + (lo - r.begin), n);
      });
    }
    return e;
  }

  double state_bytes_per_element() const override {
    double bytes = 0, elements = 0;
    for (const Part& part : parts_) {
      const double n = static_cast<double>(packed_numel(part.runs));
      bytes += n * part.opt->state_bytes_per_element();
      elements += n;
    }
    const double m = static_cast<double>(packed_numel(muon_runs_));
    bytes += 4.0 * m;
    elements += m;
    if (adafactor_) {
      bytes += static_cast<double>(adafactor_->state_bytes());
      elements += static_cast<double>(adafactor_->numel());
    }
    return elements == 0 ? 0.0 : bytes / elements;
  }

 private:
  struct Part {
    optim::OptimizerKind kind;
    std::vector<Run> runs;
    std::unique_ptr<ShardOptimizer> opt;
    std::vector<std::string> states;  // opt's state names
  };
  struct MuonScalars {
    float decay = 1.0f;               // 1 - lr wd
    double lr_times_rms_scale = 0.0;  // times sqrt(max(rows, cols)) per matrix
  };

  static size_t packed_numel(const std::vector<Run>& runs) { return runs.empty() ? 0 : runs.back().packed + (runs.back().end - runs.back().begin); }

  // Group g's hyperparameters as its kind's optimizer takes them.
  optim::Hyper own_hyper(size_t g) const {
    optim::Hyper h = options_.groups[g];
    h.kind.reset();
    return h;
  }
  // The kind that updates segment s's elements.
  optim::OptimizerKind element_kind(const optim::Segment& s) const {
    return s.param_numel == 0 ? optim::group_kind(options_, s.group) : optim::tensor_kind(options_, s.group, s.param_numel);
  }
  // Whether `kind`'s optimizer updates elements of group g (fp32 AdamW: an 8-bit group's small tensors).
  bool serves(optim::OptimizerKind kind, size_t g) const {
    const optim::OptimizerKind k = optim::group_kind(options_, static_cast<int>(g));
    return k == kind || (kind == optim::OptimizerKind::kAdamW && k == optim::OptimizerKind::kAdamW8bit);
  }
  // The options of `kind`'s optimizer: its groups as they are, the others at the defaults (valid
  // for every kind; no element of theirs is handed to it).
  optim::OptimizerOptions options_for(optim::OptimizerKind kind) const {
    optim::OptimizerOptions o = options_;
    o.kind = kind;
    for (size_t g = 0; g < o.groups.size(); ++g) o.groups[g] = serves(kind, g) ? own_hyper(g) : optim::Hyper{};
    return o;
  }

  void set_up_muon(memory::Device& device, std::vector<Run> runs, size_t packed) {
    if (!meta_ && device.kind() == memory::DeviceKind::kCuda) {
      ZERO_THROW(InvalidArgument, "optimizer: Muon runs in host memory; on {} set offload.optimizer", device.name());
    }
    if (options_.state_dtype != DType::kFloat32) {
      ZERO_THROW(InvalidArgument, "optimizer.state_dtype: Muon keeps its momentum in fp32 (got {})",
                 dtype_name(options_.state_dtype));
    }
    ZERO_CHECK(matrices_ != nullptr || meta_, "Muon groups without a matrix exchange");
    muon_runs_ = std::move(runs);
    momentum_ = device.allocate_elements(static_cast<int64_t>(packed), DType::kFloat32, memory::Category::kOptimizerState);
    if (!meta_) std::memset(momentum_.data(), 0, packed * sizeof(float));
  }

  void step_muon(const optim::StepInput& in, size_t begin, size_t end) {
    const size_t bucket = matrices_->bucket_at(begin);
    if (!matrices_->has_matrices(bucket)) return;
    float* u = matrices_->input(bucket);
    if (!matrices_->exchanges()) {
      muon_momentum(in, begin, end, u);
      matrices_->orthogonalize_bucket(bucket);
    } else if (!exchanged_) {
      // Every rank reaches the step's first bucket with matrices here, in the same order.
      ZERO_CHECK(prepared_ == matrices_->buckets_with_matrices(),
                 "Muon's exchange with {} of {} buckets prepared (the applier calls prepare_range for every bucket "
                 "first)", prepared_, matrices_->buckets_with_matrices());
      matrices_->orthogonalize_step();
      exchanged_ = true;
    }
    muon_apply(in, begin, end, u);
  }

  // m = mu m + g, and the update input u, for Muon's elements in [begin, end) (u: over the range).
  void muon_momentum(const optim::StepInput& in, size_t begin, size_t end, float* u) {
    for_each_overlap(muon_runs_, begin, end, [&](const Run& r, size_t lo, size_t hi) {
      const size_t at = lo - begin, n = hi - lo;
      const float* grad = scaled_fp32_grad(in, at, n, grad_);
      const optim::MuonHyper& h = options_.groups[static_cast<size_t>(r.segment->group)].muon;
      const float mu = h.momentum;
      float* m = momentum_.as<float>() + r.packed + (lo - r.begin);
      for (size_t i = 0; i < n; ++i) {
        const float g = grad[i];
        m[i] = m[i] * mu + g;
        u[at + i] = h.nesterov ? g + mu * m[i] : m[i];
      }
    });
  }

  // W = W (1 - lr wd) - lr rms_scale sqrt(max(rows, cols)) O for Muon's elements in [begin, end)
  // (`orthogonalized`: O over the range), and the model's copy.
  void muon_apply(const optim::StepInput& in, size_t begin, size_t end, const float* orthogonalized) {
    const size_t out_size = dtype_size(in.model_dtype);
    for_each_overlap(muon_runs_, begin, end, [&](const Run& r, size_t lo, size_t hi) {
      const size_t at = lo - begin, n = hi - lo;
      const MuonScalars& s = muon_scalars_[static_cast<size_t>(r.segment->group)];
      const float decay = s.decay;
      const double side = static_cast<double>(std::max(r.segment->rows, r.segment->cols));
      const auto step = static_cast<float>(s.lr_times_rms_scale * std::sqrt(side));
      float* w = in.master + at;
      const float* o = orthogonalized + at;
      for (size_t i = 0; i < n; ++i) {
        const float decayed = w[i] * decay;
        w[i] = decayed - step * o[i];
      }
      if (in.model_out != nullptr) {
        memory::host_kernels::convert(w, DType::kFloat32, static_cast<char*>(in.model_out) + at * out_size, in.model_dtype, n);
      }
    });
  }

  void check_state(const std::string& name, size_t begin, size_t n, const char* what) const {
    if (std::find(names_.begin(), names_.end(), name) == names_.end()) {
      ZERO_THROW(InvalidArgument, "unknown optimizer state '{}' ({} keeps {})", name, optim::optimizer_label(options_),
                 fmt::join(names_, ", "));
    }
    check_range(name, begin, n, what);
  }

  // fn(part, run, lo, hi) for each run overlapping [begin, begin + n) whose kind keeps state `name`
  // (part null: Muon's momentum).
  template <typename Fn>
  void for_each_state(const std::string& name, size_t begin, size_t n, Fn&& fn) {
    for (Part& part : parts_) {
      if (std::find(part.states.begin(), part.states.end(), name) == part.states.end()) continue;
      for_each_overlap(part.runs, begin, begin + n, [&](const Run& r, size_t lo, size_t hi) { fn(&part, r, lo, hi); });
    }
    if (name == "momentum_buffer" && !muon_runs_.empty() && !meta_) {
      for_each_overlap(muon_runs_, begin, begin + n, [&](const Run& r, size_t lo, size_t hi) { fn(nullptr, r, lo, hi); });
    }
  }

  void* state_data(const std::string& name) override {
    ZERO_THROW(InvalidArgument, "optimizer state '{}' has no single array: {} keeps each kind's state apart", name,
               optim::optimizer_label(options_));
  }

  optim::OptimizerOptions options_;
  std::vector<optim::Segment> segments_;  // by begin; the runs point into it
  MatrixExchange* matrices_;
  bool meta_;
  std::vector<std::string> names_;
  std::vector<Part> parts_;        // the elementwise kinds
  std::vector<Run> muon_runs_;     // Muon's elements
  memory::Buffer momentum_;        // Muon's state, packed
  std::vector<float> grad_;        // a Muon piece's fp32 gradient
  std::vector<MuonScalars> muon_scalars_;  // per group, this step's
  std::unique_ptr<AdafactorUpdate> adafactor_;  // Adafactor's groups (null without)
  int64_t steps_ = 0;
  size_t prepared_ = 0;    // buckets with matrices prepared this step
  bool exchanged_ = false;  // this step's exchange has run
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_grouped_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                             size_t numel, std::vector<optim::Segment> segments,
                                                             std::chrono::milliseconds timeout, OptimizerExchanges exchanges) {
  return std::make_unique<GroupedShardOptimizer>(device, std::move(options), numel, std::move(segments), timeout, exchanges);
}

}  // namespace zero
