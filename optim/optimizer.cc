#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "base/check.h"
#include "memory/buffer.h"
#include "optim/custom_optimizer.h"
#include "optim/kernels.h"
#include "optim/optimizer_checks.h"
#include "optim/step_coeffs.h"
#include "optim/step_schedule.h"
#include "optim/thread_pool.h"

namespace zero::optim {

std::vector<std::string> optimizer_state_names(OptimizerKind kind) { return detail::state_names_of(kind); }

const char* optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdagrad: return "adagrad";
    case OptimizerKind::kLion: return "lion";
    case OptimizerKind::kMuon: return "muon";
    case OptimizerKind::kAdamW8bit: return "adamw8bit";
    case OptimizerKind::kAdafactor: return "adafactor";
  }
  return "unknown";
}

OptimizerKind parse_optimizer(std::string_view name) {
  for (int k = 0; k < kNumOptimizerKinds; ++k) {
    if (name == optimizer_name(static_cast<OptimizerKind>(k))) return static_cast<OptimizerKind>(k);
  }
  ZERO_THROW(InvalidArgument, "unknown optimizer '{}' (expected adamw, adam, sgd, adagrad, lion, muon, adamw8bit or adafactor)", name);
}

OptimizerKind group_kind(const OptimizerOptions& options, int g) {
  const int n = static_cast<int>(options.groups.size());
  if (g < 0 || g >= n) ZERO_THROW(InvalidArgument, "group index {} out of range [0, {})", g, n);
  return options.groups[static_cast<size_t>(g)].kind.value_or(options.kind);
}

std::vector<OptimizerKind> group_kinds(const OptimizerOptions& options) {
  std::vector<OptimizerKind> kinds;
  for (size_t g = 0; g < options.groups.size(); ++g) {
    const OptimizerKind k = group_kind(options, static_cast<int>(g));
    if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k);
  }
  if (kinds.empty()) kinds.push_back(options.kind);
  return kinds;
}

bool has_matrix_groups(const OptimizerOptions& options) {
  if (options.custom) return false;
  const std::vector<OptimizerKind> kinds = group_kinds(options);
  return std::any_of(kinds.begin(), kinds.end(), [](OptimizerKind k) { return needs_whole_matrices(k); });
}

OptimizerKind tensor_kind(const OptimizerOptions& options, int g, size_t numel) {
  const OptimizerKind k = group_kind(options, g);
  return k == OptimizerKind::kAdamW8bit && numel < options.quant_min_numel ? OptimizerKind::kAdamW : k;
}

std::string optimizer_label(const OptimizerOptions& options) {
  if (options.custom) return "custom:" + options.custom->name();
  std::string label;
  for (OptimizerKind k : group_kinds(options)) label += (label.empty() ? "" : "+") + std::string(optimizer_name(k));
  return label;
}

std::vector<std::string> optimizer_state_names(const OptimizerOptions& options) {
  if (options.custom) return options.custom->state_names();
  std::vector<std::string> names;
  auto add = [&](const std::string& s) {
    if (std::find(names.begin(), names.end(), s) == names.end()) names.push_back(s);
  };
  for (OptimizerKind k : group_kinds(options)) {
    for (const std::string& s : optimizer_state_names(k)) add(s);
  }
  if (adafactor_first_moment(options)) add("exp_avg_update");
  return names;
}

bool adafactor_first_moment(const OptimizerOptions& options) {
  for (size_t g = 0; g < options.groups.size(); ++g) {
    if (!options.custom && group_kind(options, static_cast<int>(g)) == OptimizerKind::kAdafactor &&
        options.groups[g].adafactor.beta1 > 0.0f) {
      return true;
    }
  }
  return false;
}

void validate_quantization(const OptimizerOptions& options) {
  const size_t b = options.quant_block;
  if (b < 64 || b > 4096 || (b & (b - 1)) != 0) {
    ZERO_THROW(InvalidArgument, "quant_block must be a power of two in [64, 4096] (got {})", b);
  }
}

void validate_groups(const OptimizerOptions& options) {
  if (options.groups.empty()) ZERO_THROW(InvalidArgument, "groups must not be empty");
  for (size_t g = 0; g < options.groups.size(); ++g) {
    const int gi = static_cast<int>(g);
    const std::optional<OptimizerKind>& kind = options.groups[g].kind;
    if (kind && (static_cast<int>(*kind) < 0 || static_cast<int>(*kind) >= kNumOptimizerKinds)) {
      ZERO_THROW(InvalidArgument, "groups[{}].kind: unknown optimizer kind {}", g, static_cast<int>(*kind));
    }
    if (options.custom) {
      if (kind) {
        ZERO_THROW(InvalidArgument, "groups[{}].kind is {} but the custom optimizer '{}' runs every group", g,
                   optimizer_name(*kind), options.custom->name());
      }
      options.custom->validate(options.groups[g], gi);
    } else {
      validate_hyper(group_kind(options, gi), options.groups[g], gi);
    }
    for (const std::string& pattern : options.groups[g].params) {
      if (pattern.empty()) ZERO_THROW(InvalidArgument, "groups[{}].params: an empty name pattern", g);
    }
  }
}

bool name_matches(std::string_view pattern, std::string_view name) {
  // Greedy with one backtrack point (the last '*'): linear in practice, no recursion.
  size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::optional<int> group_by_name(const OptimizerOptions& options, std::string_view name) {
  std::optional<int> found;
  std::string found_pattern;
  for (size_t g = 0; g < options.groups.size(); ++g) {
    for (const std::string& pattern : options.groups[g].params) {
      if (!name_matches(pattern, name)) continue;
      if (found && *found != static_cast<int>(g)) {
        ZERO_THROW(InvalidArgument,
                   "parameter '{}' is matched by groups[{}].params ('{}') and by groups[{}].params ('{}'): a "
                   "parameter belongs to one group",
                   name, *found, found_pattern, g, pattern);
      }
      found = static_cast<int>(g);
      found_pattern = pattern;
      break;
    }
  }
  return found;
}

namespace {

void check_finite(float value, const char* field, int group) {
  if (!std::isfinite(value)) {
    ZERO_THROW(InvalidArgument, "groups[{}].{} must be finite (got {})", group, field, value);
  }
}
void check_at_least(float value, float lo, const char* field, int group) {
  check_finite(value, field, group);
  if (!(value >= lo)) {
    ZERO_THROW(InvalidArgument, "groups[{}].{} must be >= {} (got {})", group, field, lo, value);
  }
}
void check_beta(float value, const char* field, int group) {
  check_finite(value, field, group);
  if (!(value >= 0.0f && value < 1.0f)) {
    ZERO_THROW(InvalidArgument, "groups[{}].{} must be in [0, 1) (got {})", group, field, value);
  }
}
void check_positive(float value, const char* field, int group) {
  check_finite(value, field, group);
  if (!(value > 0.0f)) {
    ZERO_THROW(InvalidArgument, "groups[{}].{} must be > 0 (got {})", group, field, value);
  }
}

// Elements of one group handled by one thread, in shard elements.
struct Piece {
  size_t begin = 0, end = 0;
  int group = 0;
};

// Elements each thread handles: the covered (non-padding) elements in shard order, cut into
// `threads` nearly equal runs whose boundaries are multiples of 16 covered elements.
std::vector<std::vector<Piece>> partition(const std::vector<Piece>& pieces, int threads) {
  size_t covered = 0;
  for (const Piece& p : pieces) covered += p.end - p.begin;
  std::vector<std::vector<Piece>> out(static_cast<size_t>(threads));
  size_t piece = 0, offset = 0;  // position: `offset` elements into pieces[piece]
  for (int t = 0; t < threads; ++t) {
    size_t want = covered * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
    if (t + 1 < threads) want = std::min(covered, (want + 15) / 16 * 16);
    size_t done = covered * static_cast<size_t>(t) / static_cast<size_t>(threads);
    if (t > 0) done = std::min(covered, (done + 15) / 16 * 16);
    size_t need = want > done ? want - done : 0;
    while (need > 0 && piece < pieces.size()) {
      const Piece& p = pieces[piece];
      const size_t take = std::min(need, p.end - p.begin - offset);
      out[static_cast<size_t>(t)].push_back({p.begin + offset, p.begin + offset + take, p.group});
      offset += take;
      need -= take;
      if (offset == p.end - p.begin) {
        ++piece;
        offset = 0;
      }
    }
  }
  return out;
}

}  // namespace

void validate_hyper(OptimizerKind kind, const Hyper& h, int g) {
  check_at_least(h.lr, 0.0f, "lr", g);
  check_at_least(h.weight_decay, 0.0f, "weight_decay", g);
  switch (kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdamW8bit:
    case OptimizerKind::kAdam:
      check_beta(h.beta1, "beta1", g);
      check_beta(h.beta2, "beta2", g);
      check_positive(h.eps, "eps", g);
      break;
    case OptimizerKind::kLion:
      check_beta(h.beta1, "beta1", g);
      check_beta(h.beta2, "beta2", g);
      break;
    case OptimizerKind::kSgd:
      check_at_least(h.momentum, 0.0f, "momentum", g);
      check_finite(h.dampening, "dampening", g);
      if (!(h.dampening >= 0.0f && h.dampening <= 1.0f)) {
        ZERO_THROW(InvalidArgument, "groups[{}].dampening must be in [0, 1] (got {})", g, h.dampening);
      }
      if (h.nesterov && (h.momentum <= 0.0f || h.dampening != 0.0f)) {
        ZERO_THROW(InvalidArgument,
                   "groups[{}].nesterov requires momentum > 0 and dampening == 0 (got momentum {}, "
                   "dampening {})",
                   g, h.momentum, h.dampening);
      }
      break;
    case OptimizerKind::kAdagrad:
      check_positive(h.eps, "eps", g);
      check_at_least(h.lr_decay, 0.0f, "lr_decay", g);
      check_at_least(h.initial_accumulator_value, 0.0f, "initial_accumulator_value", g);
      break;
    case OptimizerKind::kAdafactor:
      check_positive(h.adafactor.eps1, "adafactor.eps1", g);
      check_at_least(h.adafactor.eps2, 0.0f, "adafactor.eps2", g);
      check_positive(h.adafactor.clip_threshold, "adafactor.clip_threshold", g);
      if (!(h.adafactor.decay_rate > 0.0f && h.adafactor.decay_rate <= 1.0f)) {
        ZERO_THROW(InvalidArgument, "groups[{}].adafactor.decay_rate must be in (0, 1] (got {})", g, h.adafactor.decay_rate);
      }
      if (!(h.adafactor.beta1 >= 0.0f && h.adafactor.beta1 < 1.0f)) {
        ZERO_THROW(InvalidArgument, "groups[{}].adafactor.beta1 must be in [0, 1) (got {})", g, h.adafactor.beta1);
      }
      break;
    case OptimizerKind::kMuon:
      check_beta(h.muon.momentum, "muon.momentum", g);
      check_positive(h.muon.rms_scale, "muon.rms_scale", g);
      if (h.muon.ns_steps < 1 || h.muon.ns_steps > 100) {
        ZERO_THROW(InvalidArgument, "groups[{}].muon.ns_steps must be in [1, 100] (got {})", g, h.muon.ns_steps);
      }
      break;
  }
}

struct Optimizer::Impl {
  Impl(const OptimizerOptions& opts, size_t numel, std::vector<Segment> segs)
      : options(opts),
        shard_numel(numel),
        segments(std::move(segs)),
        path(opts.simd_path.value_or(best_simd_path())),
        table(&detail::kernel_table(path)),
        pool(opts.num_threads) {}

  OptimizerOptions options;
  size_t shard_numel;
  std::vector<Segment> segments;
  SimdPath path;
  const detail::KernelTable* table;
  detail::StepSchedule schedule;
  std::vector<std::string> state_names;
  std::vector<memory::Buffer> states;  // 64-byte aligned, zero-filled, tracked host memory
  std::vector<std::vector<Piece>> thread_pieces;
  detail::SegmentsByParam segments_by_param;
  std::vector<Piece> sorted_pieces;  // covered elements in shard order

  // Runs the step over `work` with the groups' `coeffs`; the pointers of `in` refer to element `base`.
  void run(const StepInput& in, size_t base, const std::vector<std::vector<Piece>>& work,
           const std::vector<StepCoeffs>& coeffs);
  ThreadPool pool;

  int state_index(const std::string& name) const {
    return detail::state_index(state_names, name, options.kind);
  }
};

namespace detail {

std::vector<std::string> state_names_of(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam: return {"exp_avg", "exp_avg_sq"};
    case OptimizerKind::kSgd: return {"momentum_buffer"};
    case OptimizerKind::kAdagrad: return {"sum"};
    case OptimizerKind::kLion: return {"exp_avg"};
    case OptimizerKind::kMuon: return {"momentum_buffer"};
    // The dequantized moments, then each block's absmax, repeated on each of its elements: what
    // restores the codes and scales bit for bit (optim/dynamic_quantization.h).
    case OptimizerKind::kAdamW8bit: return {"exp_avg", "exp_avg_sq", "exp_avg_absmax", "exp_avg_sq_absmax"};
    // A vector's V; a matrix's R and C, each read on every element of its row or column.
    case OptimizerKind::kAdafactor: return {"exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col"};
  }
  return {};
}

void validate_common_options(const OptimizerOptions& o) {
  if (static_cast<int>(o.kind) < 0 || static_cast<int>(o.kind) >= kNumOptimizerKinds) {
    ZERO_THROW(InvalidArgument, "kind: unknown optimizer kind {}", static_cast<int>(o.kind));
  }
  validate_groups(o);
  if (o.state_dtype != DType::kFloat32 && o.state_dtype != DType::kBFloat16) {
    ZERO_THROW(InvalidArgument, "state_dtype must be fp32 or bf16 (got {})", dtype_name(o.state_dtype));
  }
  validate_quantization(o);
}

void require_one_elementwise_kind(const OptimizerOptions& o, const char* who) {
  for (size_t g = 0; g < o.groups.size(); ++g) {
    const OptimizerKind k = group_kind(o, static_cast<int>(g));
    if (!is_elementwise(k)) {
      ZERO_THROW(InvalidArgument, "groups[{}].kind: {} runs elementwise rules over flat fp32 or bf16 state; {} needs "
                 "{}, which an engine provides (zero::Engine)", g, who, optimizer_name(k),
                 k == OptimizerKind::kMuon        ? "whole matrices"
                 : k == OptimizerKind::kAdamW8bit ? "state quantized per block of each tensor"
                                                  : "sums over each tensor's rows and columns");
    }
    if (k != o.kind) {
      ZERO_THROW(InvalidArgument, "groups[{}].kind: {} runs one rule ({}) over its shard, not {}; an engine runs "
                 "groups of several kinds (zero::Engine)", g, who, optimizer_name(o.kind), optimizer_name(k));
    }
  }
}

SegmentsByParam validate_segments(const std::vector<Segment>& segs, size_t shard_numel,
                                  int num_groups) {
  for (size_t i = 0; i < segs.size(); ++i) {
    const Segment& s = segs[i];
    if (s.begin > s.end) {
      ZERO_THROW(InvalidArgument, "segments[{}].begin ({}) > segments[{}].end ({})", i, s.begin, i,
                 s.end);
    }
    if (s.end > shard_numel) {
      ZERO_THROW(InvalidArgument, "segments[{}].end ({}) > shard_numel ({})", i, s.end, shard_numel);
    }
    if (s.group < 0 || s.group >= num_groups) {
      ZERO_THROW(InvalidArgument, "segments[{}].group ({}) out of range [0, {})", i, s.group,
                 num_groups);
    }
  }
  std::vector<size_t> order(segs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return segs[a].begin < segs[b].begin; });
  // Sorted by begin, a non-empty segment overlaps an earlier one iff it starts before the furthest
  // end seen so far.
  size_t furthest = 0;  // index into segs of the non-empty segment with the largest end so far
  bool any = false;
  for (size_t k = 0; k < order.size(); ++k) {
    const Segment& b = segs[order[k]];
    if (b.begin == b.end) continue;
    if (any && b.begin < segs[furthest].end) {
      const Segment& a = segs[furthest];
      ZERO_THROW(InvalidArgument, "segments[{}] [{}, {}) overlaps segments[{}] [{}, {})", furthest,
                 a.begin, a.end, order[k], b.begin, b.end);
    }
    if (!any || b.end > segs[furthest].end) furthest = order[k];
    any = true;
  }

  // Segments by parameter, with a check that no element of a parameter appears twice.
  SegmentsByParam by_param;
  for (size_t i = 0; i < segs.size(); ++i) {
    const Segment& s = segs[i];
    if (!s.param_name.empty() && s.end > s.begin) by_param[s.param_name].push_back(i);
  }
  for (auto& [name, idx] : by_param) {
    std::sort(idx.begin(), idx.end(),
              [&](size_t a, size_t b) { return segs[a].param_offset < segs[b].param_offset; });
    for (size_t k = 1; k < idx.size(); ++k) {
      const Segment& a = segs[idx[k - 1]];
      const Segment& b = segs[idx[k]];
      if (b.param_offset < a.param_offset + (a.end - a.begin)) {
        ZERO_THROW(InvalidArgument,
                   "segments[{}] and segments[{}] both hold elements [{}, {}) of parameter '{}'",
                   idx[k - 1], idx[k], b.param_offset,
                   std::min(a.param_offset + (a.end - a.begin), b.param_offset + (b.end - b.begin)),
                   name);
      }
    }
  }
  return by_param;
}

// run() relies on the dtypes being valid.
void check_step_input(const StepInput& in, size_t n, const char* what) {
  if (detail::grad_type_index(in.grad_dtype) < 0) {
    ZERO_THROW(InvalidArgument, "StepInput.grad_dtype must be fp32, fp16 or bf16 (got {})",
               dtype_name(in.grad_dtype));
  }
  const bool has_out = in.model_out != nullptr;
  if (detail::out_type_index(has_out, in.model_dtype) < 0) {
    ZERO_THROW(InvalidArgument, "StepInput.model_dtype must be fp32, fp16 or bf16 (got {})",
               dtype_name(in.model_dtype));
  }
  const auto check_len = [&](const std::optional<size_t>& len, const char* field) {
    if (len && *len != n) {
      ZERO_THROW(InvalidArgument, "StepInput.{} ({}) != {} ({})", field, *len, what, n);
    }
  };
  check_len(in.master_numel, "master_numel");
  check_len(in.grad_numel, "grad_numel");
  if (has_out) check_len(in.model_numel, "model_numel");
  if (n > 0) {
    if (in.master == nullptr) ZERO_THROW(InvalidArgument, "StepInput.master is null");
    if (in.grad == nullptr) ZERO_THROW(InvalidArgument, "StepInput.grad is null");
  }
  if (!std::isfinite(in.grad_scale)) {
    ZERO_THROW(InvalidArgument, "StepInput.grad_scale must be finite (got {})", in.grad_scale);
  }
}

}  // namespace detail

Optimizer::Optimizer(const OptimizerOptions& options, size_t shard_numel,
                     std::vector<Segment> segments) {
  if (options.custom) {
    ZERO_THROW(InvalidArgument, "custom: optim::Optimizer runs the built-in rules; '{}' runs in an engine",
               options.custom->name());
  }
  detail::validate_common_options(options);
  detail::require_one_elementwise_kind(options, "optim::Optimizer");
  if (options.num_threads < 1 || options.num_threads > 1024) {
    ZERO_THROW(InvalidArgument, "num_threads must be in [1, 1024] (got {})", options.num_threads);
  }
  detail::SegmentsByParam by_param =
      detail::validate_segments(segments, shard_numel, static_cast<int>(options.groups.size()));
  impl_ = std::make_unique<Impl>(options, shard_numel, std::move(segments));
  Impl& m = *impl_;
  m.segments_by_param = std::move(by_param);

  // State arrays.
  m.state_names = detail::state_names_of(options.kind);
  const size_t bytes = shard_numel * dtype_size(options.state_dtype);
  for (size_t i = 0; i < m.state_names.size(); ++i) {
    m.states.push_back(memory::allocate_host(bytes, memory::Category::kOptimizerState,
                                            options.tracker ? *options.tracker : memory::MemoryTracker::global()));
  }
  if (options.kind == OptimizerKind::kAdagrad) {
    // torch.full_like(p, initial_accumulator_value), per group.
    for (const Segment& s : m.segments) {
      const float v = options.groups[static_cast<size_t>(s.group)].initial_accumulator_value;
      if (v == 0.0f || s.param_name.empty()) continue;
      for (size_t e = s.begin; e < s.end; ++e) {
        if (options.state_dtype == DType::kFloat32) {
          static_cast<float*>(m.states[0].data())[e] = v;
        } else {
          static_cast<uint16_t*>(m.states[0].data())[e] = fp32_to_bf16_bits(v);
        }
      }
    }
  }
  m.schedule = detail::StepSchedule(options.groups.size());

  // Work of each thread, fixed for the optimizer's life.
  std::vector<Piece> pieces;
  for (const Segment& s : m.segments) {
    if (!s.param_name.empty() && s.end > s.begin) pieces.push_back({s.begin, s.end, s.group});
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  m.thread_pieces = partition(pieces, options.num_threads);
  m.sorted_pieces = std::move(pieces);
}

Optimizer::~Optimizer() = default;
Optimizer::Optimizer(Optimizer&&) noexcept = default;
Optimizer& Optimizer::operator=(Optimizer&&) noexcept = default;

void Optimizer::Impl::run(const StepInput& in, size_t base, const std::vector<std::vector<Piece>>& work,
                          const std::vector<StepCoeffs>& coeffs) {
  const int gi = detail::grad_type_index(in.grad_dtype);
  const int oi = detail::out_type_index(in.model_out != nullptr, in.model_dtype);
  const int si = detail::state_type_index(options.state_dtype);
  const detail::StepFn fn = table->step[static_cast<int>(options.kind)][gi][si][oi];
  const size_t grad_size = dtype_size(in.grad_dtype);
  const size_t state_size = dtype_size(options.state_dtype);
  const size_t out_size = in.model_out != nullptr ? dtype_size(in.model_dtype) : 0;
  auto* grad = static_cast<const char*>(in.grad);
  auto* out = static_cast<char*>(in.model_out);
  char* s0 = states.empty() ? nullptr : static_cast<char*>(states[0].data());
  char* s1 = states.size() < 2 ? nullptr : static_cast<char*>(states[1].data());
  pool.run([&](int t) {
    for (const Piece& p : work[static_cast<size_t>(t)]) {
      const size_t rel = p.begin - base;
      detail::StepArgs a;
      a.master = in.master + rel;
      a.grad = grad + rel * grad_size;
      a.state0 = s0 ? s0 + p.begin * state_size : nullptr;
      a.state1 = s1 ? s1 + p.begin * state_size : nullptr;
      a.model_out = out ? out + rel * out_size : nullptr;
      a.n = p.end - p.begin;
      a.coeffs = &coeffs[static_cast<size_t>(p.group)];
      fn(a);
    }
  });
}

void Optimizer::step(const StepInput& in) {
  ZERO_CHECK(impl_ != nullptr, "use of a moved-from Optimizer");
  Impl& m = *impl_;
  // Checked before begin_step() so that a bad input leaves step_count() as it was.
  detail::check_step_input(in, m.shard_numel, "shard_numel");
  m.schedule.begin_step(m.options);
  m.run(in, 0, m.thread_pieces, m.schedule.range_coeffs(m.options, 0, m.shard_numel, m.shard_numel, in.grad_scale));
}

void Optimizer::begin_step() {
  ZERO_CHECK(impl_ != nullptr, "use of a moved-from Optimizer");
  impl_->schedule.begin_step(impl_->options);
}

void Optimizer::step_range(const StepInput& in, size_t begin, size_t end) {
  ZERO_CHECK(impl_ != nullptr, "use of a moved-from Optimizer");
  Impl& m = *impl_;
  const std::vector<StepCoeffs>& coeffs = m.schedule.range_coeffs(m.options, begin, end, m.shard_numel, in.grad_scale);
  detail::check_step_input(in, end - begin, "range length");
  std::vector<Piece> clipped;
  for (const Piece& p : m.sorted_pieces) {
    const size_t lo = std::max(p.begin, begin), hi = std::min(p.end, end);
    if (lo < hi) clipped.push_back({lo, hi, p.group});
  }
  m.run(in, begin, partition(clipped, m.options.num_threads), coeffs);
}

int64_t Optimizer::step_count() const { return impl_->schedule.step_count(); }
void Optimizer::set_step_count(int64_t steps) { impl_->schedule.set_step_count(steps); }

OptimizerKind Optimizer::kind() const { return impl_->options.kind; }
size_t Optimizer::shard_numel() const { return impl_->shard_numel; }
const std::vector<Segment>& Optimizer::segments() const { return impl_->segments; }

Hyper& Optimizer::group(int i) { return detail::group_at(impl_->options, i); }
const Hyper& Optimizer::group(int i) const { return const_cast<Optimizer*>(this)->group(i); }
int Optimizer::num_groups() const { return static_cast<int>(impl_->options.groups.size()); }
int Optimizer::num_threads() const { return impl_->pool.size(); }
SimdPath Optimizer::simd_path() const { return impl_->path; }

std::vector<std::string> Optimizer::state_names() const { return impl_->state_names; }
DType Optimizer::state_dtype() const { return impl_->options.state_dtype; }

void* Optimizer::state_data(const std::string& name) {
  return impl_->states[static_cast<size_t>(impl_->state_index(name))].data();
}
const void* Optimizer::state_data(const std::string& name) const {
  return impl_->states[static_cast<size_t>(impl_->state_index(name))].data();
}

namespace {

// Calls fn(shard_index, range_index, count) for each overlap of [begin, end) of `param` with the
// segments that hold it; returns the total count.
template <typename Fn>
size_t for_each_overlap(const std::vector<Segment>& segments,
                        const std::unordered_map<std::string, std::vector<size_t>>& by_param,
                        const std::string& param, size_t begin, size_t end, Fn&& fn) {
  if (begin > end) {
    ZERO_THROW(InvalidArgument, "param_begin ({}) > param_end ({}) for parameter '{}'", begin, end,
               param);
  }
  const auto it = by_param.find(param);
  if (it == by_param.end()) return 0;
  size_t total = 0;
  for (size_t idx : it->second) {
    const Segment& s = segments[idx];
    const size_t lo = std::max(begin, s.param_offset);
    const size_t hi = std::min(end, s.param_offset + (s.end - s.begin));
    if (lo >= hi) continue;
    fn(s.begin + (lo - s.param_offset), lo - begin, hi - lo);
    total += hi - lo;
  }
  return total;
}

}  // namespace

size_t Optimizer::read_state(const std::string& state, const std::string& param_name,
                             size_t param_begin, size_t param_end, float* out) const {
  const Impl& m = *impl_;
  const void* data = m.states[static_cast<size_t>(m.state_index(state))].data();
  if (out == nullptr && param_end > param_begin) ZERO_THROW(InvalidArgument, "read_state: out is null");
  return for_each_overlap(m.segments, m.segments_by_param, param_name, param_begin, param_end,
                          [&](size_t shard, size_t dst, size_t n) {
                            if (m.options.state_dtype == DType::kFloat32) {
                              std::copy_n(static_cast<const float*>(data) + shard, n, out + dst);
                            } else {
                              convert_bf16_to_fp32(static_cast<const uint16_t*>(data) + shard,
                                                   out + dst, n);
                            }
                          });
}

size_t Optimizer::write_state(const std::string& state, const std::string& param_name,
                              size_t param_begin, size_t param_end, const float* in) {
  Impl& m = *impl_;
  void* data = m.states[static_cast<size_t>(m.state_index(state))].data();
  if (in == nullptr && param_end > param_begin) ZERO_THROW(InvalidArgument, "write_state: in is null");
  return for_each_overlap(m.segments, m.segments_by_param, param_name, param_begin, param_end,
                          [&](size_t shard, size_t src, size_t n) {
                            if (m.options.state_dtype == DType::kFloat32) {
                              std::copy_n(in + src, n, static_cast<float*>(data) + shard);
                            } else {
                              convert_fp32_to_bf16(in + src, static_cast<uint16_t*>(data) + shard, n);
                            }
                          });
}

}  // namespace zero::optim
