#include "optim/cuda/cuda_optimizer.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "base/check.h"
#include "optim/cuda/multi_tensor_step.h"
#include "optim/optimizer_checks.h"
#include "optim/step_coeffs.h"
#include "optim/step_schedule.h"

#ifdef ZERO_WITH_CUDA
#include <cuda_runtime.h>

#include "optim/cuda/fill_kernels.h"
#endif

namespace zero::optim::cuda {

namespace {

constexpr const char* kNoCuda = "CudaOptimizer: built without CUDA (build with --config=cuda)";

// A non-padding, non-empty segment: the unit of work of a step.
struct Piece {
  size_t begin = 0, end = 0;
  int group = 0;
};

}  // namespace

struct CudaOptimizer::Impl {
  OptimizerOptions options;
  size_t shard_numel = 0;
  std::vector<Segment> segments;
  std::vector<Piece> pieces;  // sorted by begin (and so by end: segments do not overlap)
  optim::detail::StepSchedule schedule;
  std::vector<std::string> state_names;
  std::vector<void*> states;          // device arrays owned by the caller
  std::vector<DeviceRange> ranges;    // reserved for every piece: step_range never allocates

  int state_index(const std::string& name) const {
    return optim::detail::state_index(state_names, name, options.kind);
  }
};

#ifdef ZERO_WITH_CUDA

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    ZERO_THROW(Error, "CudaOptimizer: {} failed: {} ({})", what, cudaGetErrorName(e),
               cudaGetErrorString(e));
  }
}

// torch.full_like(p, initial_accumulator_value) per group: fills Adagrad's "sum" over each
// segment whose group has a non-zero value (the allocator's memory is zero already), adjacent
// segments with the same value merged into one range, then waits for the fill so that the state is
// ready on every stream once the constructor returns.
void fill_accumulator(const std::vector<Piece>& pieces, const OptimizerOptions& options, void* sum,
                      void* stream) {
  const bool fp32 = options.state_dtype == DType::kFloat32;
  std::vector<detail::FillRange> runs;
  for (const Piece& p : pieces) {
    const float v = options.groups[static_cast<size_t>(p.group)].initial_accumulator_value;
    if (v == 0.0f) continue;
    const uint32_t bits = fp32 ? float_bits(v) : fp32_to_bf16_bits(v);
    if (!runs.empty() && runs.back().begin + runs.back().n == p.begin && runs.back().bits == bits) {
      runs.back().n += p.end - p.begin;
    } else {
      runs.push_back({p.begin, p.end - p.begin, bits});
    }
  }
  if (runs.empty()) return;

  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiProcessorCount)");
  detail::FillParams params;
  params.data = sum;
  params.elem_bytes = fp32 ? 4 : 2;
  for (size_t next = 0; next < runs.size();) {
    params.num_ranges = 0;
    unsigned long long chunks = 0;
    for (; next < runs.size() && params.num_ranges < detail::kMaxFillRanges; ++next) {
      params.chunk_begin[params.num_ranges] = chunks;
      params.ranges[params.num_ranges++] = runs[next];
      chunks += (runs[next].n + detail::kFillChunk - 1) / detail::kFillChunk;
    }
    params.chunk_begin[params.num_ranges] = chunks;
    const unsigned long long grid =
        std::min<unsigned long long>(chunks, static_cast<unsigned long long>(std::max(1, sms)) * 8);
    check_cuda(static_cast<cudaError_t>(
                   detail::launch_fill(params, static_cast<unsigned>(grid), stream)),
               "initial_accumulator_value fill launch");
  }
  check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
             "cudaStreamSynchronize after the initial_accumulator_value fill");
}

}  // namespace

#endif  // ZERO_WITH_CUDA

CudaOptimizer::CudaOptimizer(const OptimizerOptions& options, size_t shard_numel,
                             std::vector<Segment> segments, StateAllocator alloc, void* stream) {
  // Everything that can be checked is checked before any CUDA call, so that a bad configuration
  // fails the same way with or without a device (and in a CPU build).
  optim::detail::validate_common_options(options);
  optim::detail::require_one_elementwise_kind(options, "the CUDA optimizer");
  (void)optim::detail::validate_segments(segments, shard_numel,
                                        static_cast<int>(options.groups.size()));
  if (!alloc) ZERO_THROW(InvalidArgument, "alloc (the StateAllocator) must be set");
  const size_t state_size = dtype_size(options.state_dtype);
  if (shard_numel > std::numeric_limits<size_t>::max() / state_size) {
    ZERO_THROW(InvalidArgument, "shard_numel ({}) is too large for {} state", shard_numel,
               dtype_name(options.state_dtype));
  }
#ifndef ZERO_WITH_CUDA
  (void)stream;
  ZERO_THROW(InvalidArgument, "{}", kNoCuda);
#else
  impl_ = std::make_unique<Impl>();
  Impl& m = *impl_;
  m.options = options;
  m.shard_numel = shard_numel;
  m.segments = std::move(segments);
  for (const Segment& s : m.segments) {
    if (!s.param_name.empty() && s.end > s.begin) m.pieces.push_back({s.begin, s.end, s.group});
  }
  std::sort(m.pieces.begin(), m.pieces.end(),
            [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  m.ranges.reserve(m.pieces.size());
  m.schedule = optim::detail::StepSchedule(options.groups.size());

  m.state_names = optim::detail::state_names_of(options.kind);
  const size_t bytes = shard_numel * state_size;
  for (const std::string& name : m.state_names) {
    void* p = alloc(bytes, name);
    if (p == nullptr && bytes > 0) {
      ZERO_THROW(AllocationError, "CudaOptimizer: alloc returned null for state '{}' ({} bytes)",
                 name, bytes);
    }
    m.states.push_back(p);
  }
  if (options.kind == OptimizerKind::kAdagrad) {
    fill_accumulator(m.pieces, options, m.states[0], stream);
  }
#endif
}

CudaOptimizer::~CudaOptimizer() = default;
CudaOptimizer::CudaOptimizer(CudaOptimizer&&) noexcept = default;
CudaOptimizer& CudaOptimizer::operator=(CudaOptimizer&&) noexcept = default;

void CudaOptimizer::step(const StepInput& in, void* stream) {
  ZERO_CHECK(impl_ != nullptr, "use of a moved-from CudaOptimizer");
  // Checked before begin_step() so that a bad input leaves step_count() as it was.
  optim::detail::check_step_input(in, impl_->shard_numel, "shard_numel");
  begin_step();
  step_range(in, 0, impl_->shard_numel, stream);
}

void CudaOptimizer::begin_step() {
  ZERO_CHECK(impl_ != nullptr, "use of a moved-from CudaOptimizer");
  impl_->schedule.begin_step(impl_->options);
}

void CudaOptimizer::step_range(const StepInput& in, size_t begin, size_t end, void* stream) {
  ZERO_CHECK(impl_ != nullptr, "use of a moved-from CudaOptimizer");
  Impl& m = *impl_;
  const std::vector<StepCoeffs>& coeffs = m.schedule.range_coeffs(m.options, begin, end, m.shard_numel, in.grad_scale);
  optim::detail::check_step_input(in, end - begin, "range length");

  const size_t grad_size = dtype_size(in.grad_dtype);
  const size_t state_size = dtype_size(m.options.state_dtype);
  const size_t out_size = in.model_out != nullptr ? dtype_size(in.model_dtype) : 0;
  auto* grad = static_cast<const char*>(in.grad);
  auto* out = static_cast<char*>(in.model_out);
  char* s0 = m.states.empty() ? nullptr : static_cast<char*>(m.states[0]);
  char* s1 = m.states.size() < 2 ? nullptr : static_cast<char*>(m.states[1]);
  m.ranges.clear();  // keeps the capacity reserved at construction
  // The first piece ending after `begin`, then every piece starting before `end`.
  auto it = std::upper_bound(m.pieces.begin(), m.pieces.end(), begin,
                             [](size_t b, const Piece& p) { return b < p.end; });
  for (; it != m.pieces.end() && it->begin < end; ++it) {
    const size_t lo = std::max(it->begin, begin), hi = std::min(it->end, end);
    if (lo >= hi) continue;  // an empty [begin, end) inside a piece
    const size_t rel = lo - begin;  // offset into the arrays of `in`
    DeviceRange r;
    r.master = in.master + rel;
    r.grad = grad + rel * grad_size;
    r.state0 = s0 != nullptr ? s0 + lo * state_size : nullptr;
    r.state1 = s1 != nullptr ? s1 + lo * state_size : nullptr;
    r.model_out = out != nullptr ? out + rel * out_size : nullptr;
    r.n = hi - lo;
    r.coeffs = coeffs[static_cast<size_t>(it->group)];
    m.ranges.push_back(r);
  }
  if (m.ranges.empty()) return;
#ifdef ZERO_WITH_CUDA
  DeviceStepConfig config;
  config.kind = m.options.kind;
  config.grad_dtype = in.grad_dtype;
  config.state_dtype = m.options.state_dtype;
  config.copy_out = in.model_out != nullptr;
  config.model_dtype = in.model_dtype;
  multi_tensor_step(config, m.ranges, stream);
#else
  // Unreachable: no CudaOptimizer can be constructed without CUDA.
  (void)stream;
  ZERO_THROW(InvalidArgument, "{}", kNoCuda);
#endif
}

int64_t CudaOptimizer::step_count() const { return impl_->schedule.step_count(); }
void CudaOptimizer::set_step_count(int64_t steps) { impl_->schedule.set_step_count(steps); }

OptimizerKind CudaOptimizer::kind() const { return impl_->options.kind; }
size_t CudaOptimizer::shard_numel() const { return impl_->shard_numel; }
const std::vector<Segment>& CudaOptimizer::segments() const { return impl_->segments; }

Hyper& CudaOptimizer::group(int i) { return optim::detail::group_at(impl_->options, i); }
const Hyper& CudaOptimizer::group(int i) const { return const_cast<CudaOptimizer*>(this)->group(i); }
int CudaOptimizer::num_groups() const { return static_cast<int>(impl_->options.groups.size()); }

std::vector<std::string> CudaOptimizer::state_names() const { return impl_->state_names; }
DType CudaOptimizer::state_dtype() const { return impl_->options.state_dtype; }

void* CudaOptimizer::state_data(const std::string& name) {
  return impl_->states[static_cast<size_t>(impl_->state_index(name))];
}
const void* CudaOptimizer::state_data(const std::string& name) const {
  return impl_->states[static_cast<size_t>(impl_->state_index(name))];
}

}  // namespace zero::optim::cuda
