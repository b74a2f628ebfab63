#include "zero/adafactor_update.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "memory/host_kernels.h"
#include "optim/step_coeffs.h"
#include "zero/optimizer_runs.h"
#include "zero/shard_optimizer.h"

namespace zero {

AdafactorUpdate::AdafactorUpdate(memory::Device& device, const optim::OptimizerOptions& options,
                                 std::vector<const optim::Segment*> segments, AdafactorStats* stats, bool meta)
    : stats_(stats), meta_(meta), groups_(options.groups) {
  ZERO_CHECK(stats_ != nullptr, "Adafactor groups without their statistics' exchange");
  const std::vector<FactoredTensor>& tensors = stats_->tensors();
  matrix_of_.assign(tensors.size(), SIZE_MAX);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].rows == 0) continue;
    matrix_of_[i] = matrices_.size();
    matrices_.push_back({rc_numel_, rc_numel_ + tensors[i].rows});
    rc_numel_ += tensors[i].rows + tensors[i].cols;
  }
  std::sort(segments.begin(), segments.end(), [](const optim::Segment* a, const optim::Segment* b) { return a->begin < b->begin; });
  for (const optim::Segment* s : segments) {
    const AdafactorStats::Slot* slot = stats_->find(s->param_name);
    ZERO_CHECK(slot != nullptr, "parameter '{}' runs Adafactor but has no statistics slot", s->param_name);
    Run r{s->begin, s->end, s, slot, 0, SIZE_MAX, {}};
    if (slot->t.split) r.whole = slot->t.split.runs(s->param_offset, s->param_offset + (s->end - s->begin));
    if (slot->t.rows == 0) {
      r.v_at = v_numel_;
      v_numel_ += s->end - s->begin;
    }
    if (groups_.at(static_cast<size_t>(slot->t.group)).adafactor.beta1 > 0.0f) {
      r.m_at = m_numel_;
      m_numel_ += s->end - s->begin;
    }
    runs_.push_back(r);
  }
  for (const optim::Hyper& h : groups_) first_moment_.push_back(h.adafactor.beta1 > 0.0f);
  rc_ = device.allocate_elements(static_cast<int64_t>(rc_numel_), DType::kFloat32, memory::Category::kOptimizerState);
  v_ = device.allocate_elements(static_cast<int64_t>(v_numel_), DType::kFloat32, memory::Category::kOptimizerState);
  m_ = device.allocate_elements(static_cast<int64_t>(m_numel_), DType::kFloat32, memory::Category::kOptimizerState);
  if (meta_) return;
  std::fill(rc(), rc() + rc_numel_, 0.0f);
  std::fill(v(), v() + v_numel_, 0.0f);
  std::fill(m(), m() + m_numel_, 0.0f);
}

template <typename Fn>
void AdafactorUpdate::for_each_whole(const Run& r, size_t lo, size_t n, Fn&& fn) {
  const size_t first = r.segment->param_offset + (lo - r.begin);  // the part's element index
  if (r.whole.empty()) {
    for (size_t k = 0; k < n; ++k) fn(k, first + k);
    return;
  }
  // The runs cover the segment in the part's order: the first one that ends past `first`, then on.
  auto it = std::upper_bound(r.whole.begin(), r.whole.end(), first,
                             [](size_t x, const SplitRun& w) { return x < w.local + w.n; });
  for (size_t k = 0; k < n; ++it) {
    ZERO_CHECK(it != r.whole.end(), "element {} of '{}' lies past its runs", first + k, r.segment->param_name);
    const size_t from = first + k - it->local, take = std::min(it->n - from, n - k);
    for (size_t j = 0; j < take; ++j) fn(k + j, it->whole + from + j);
    k += take;
  }
}

void AdafactorUpdate::begin_step(const optim::OptimizerOptions& options, int64_t step) {
  for (size_t g = 0; g < first_moment_.size(); ++g) {
    if ((options.groups.at(g).adafactor.beta1 > 0.0f) != first_moment_[g]) {
      ZERO_THROW(InvalidArgument,
                 "groups[{}].adafactor.beta1 changed {} 0 after the engine was built: the first moment's state is "
                 "allocated at finalize()",
                 g, first_moment_[g] ? "to" : "from");
    }
  }
  groups_ = options.groups;
  step_ = step;
  if (merge_pending_ && !meta_) stats_->merge_max(rc(), rc_numel_);
  merge_pending_ = written_ = false;
}

void AdafactorUpdate::loaded() {
  // Rows and columns this rank wrote none of are zero, so the maximum over the ranks is the loaded.
  if (!written_ && !meta_) std::fill(rc(), rc() + rc_numel_, 0.0f);
  merge_pending_ = true;
}

void AdafactorUpdate::step(const optim::StepInput& in, size_t begin, size_t end) {
  if (meta_) return;
  const size_t bucket = stats_->bucket_at(begin);
  if (bucket == SIZE_MAX || stats_->slots(bucket).empty()) return;
  const std::vector<AdafactorStats::Slot>& slots = stats_->slots(bucket);
  float* const rcv = rc();
  const auto hyper = [&](const AdafactorStats::Slot& s) -> const optim::Hyper& {
    return groups_.at(static_cast<size_t>(s.t.group));
  };
  // Pass 1: this rank's part of each tensor's row and column sums of G^2 + eps1, and of sum X^2.
  stats_buf_.assign(stats_->stats_size(bucket), 0.0);
  for_each_overlap(runs_, begin, end, [&](const Run& r, size_t lo, size_t hi) {
    const size_t n = hi - lo;
    const float* g = scaled_fp32_grad(in, lo - begin, n, grad_);
    const float* w = in.master + (lo - begin);
    const AdafactorStats::Slot& s = *r.slot;
    const float eps1 = hyper(s).adafactor.eps1;
    if (s.t.rows != 0) {
      for_each_whole(r, lo, n, [&](size_t k, size_t e) {
        const float sq = g[k] * g[k] + eps1;
        stats_buf_[s.rows_at + e / s.t.cols] += sq;
        stats_buf_[s.rows_at + s.t.rows + e % s.t.cols] += sq;
      });
    }
    double squares = 0.0;
    for (size_t k = 0; k < n; ++k) squares += static_cast<double>(w[k]) * w[k];
    stats_buf_[s.squares_at] += squares;
  });
  stats_->sum_stats(bucket, stats_buf_.data());
  // Every matrix of the bucket: R and C from the reduced sums (the same on every rank), and sum R.
  std::vector<float> row_total(slots.size(), 0.0f);
  for (size_t i = 0; i < slots.size(); ++i) {
    const AdafactorStats::Slot& s = slots[i];
    if (s.t.rows == 0) continue;
    const double beta = beta2(hyper(s));
    const float b = static_cast<float>(beta), rest = static_cast<float>(1.0 - beta);
    const Matrix& m = matrices_[matrix_of_[s.index]];
    double total = 0.0;
    for (size_t j = 0; j < s.t.rows; ++j) {
      rcv[m.r_at + j] = rcv[m.r_at + j] * b + static_cast<float>(stats_buf_[s.rows_at + j]) * rest;
      total += rcv[m.r_at + j];
    }
    for (size_t j = 0; j < s.t.cols; ++j) {
      rcv[m.c_at + j] = rcv[m.c_at + j] * b + static_cast<float>(stats_buf_[s.rows_at + s.t.rows + j]) * rest;
    }
    row_total[i] = static_cast<float>(total);
  }
  // Pass 2: U = G / sqrt(V) (a vector's V updated here), and this rank's part of sum U^2.
  update_buf_.assign(stats_->update_size(bucket), 0.0);
  u_.resize(end - begin);
  for_each_overlap(runs_, begin, end, [&](const Run& r, size_t lo, size_t hi) {
    const size_t n = hi - lo;
    const float* g = scaled_fp32_grad(in, lo - begin, n, grad_);
    const AdafactorStats::Slot& s = *r.slot;
    float* u = u_.data() + (lo - begin);
    double squares = 0.0;
    if (s.t.rows != 0) {
      const Matrix& m = matrices_[matrix_of_[s.index]];
      const float total = row_total[static_cast<size_t>(&s - slots.data())];
      for_each_whole(r, lo, n, [&](size_t k, size_t e) {
        const float vhat = (rcv[m.r_at + e / s.t.cols] * rcv[m.c_at + e % s.t.cols]) / total;
        u[k] = g[k] / std::sqrt(vhat);
      });
      for (size_t k = 0; k < n; ++k) squares += static_cast<double>(u[k]) * u[k];
    } else {
      const double beta = beta2(hyper(s));
      const float b = static_cast<float>(beta), rest = static_cast<float>(1.0 - beta);
      const float eps1 = hyper(s).adafactor.eps1;
      float* vv = v() + r.v_at + (lo - r.begin);
      for (size_t k = 0; k < n; ++k) {
        const float sq = g[k] * g[k] + eps1;
        vv[k] = vv[k] * b + sq * rest;
        u[k] = g[k] / std::sqrt(vv[k]);
        squares += static_cast<double>(u[k]) * u[k];
      }
    }
    update_buf_[s.update_at] += squares;
  });
  stats_->sum_updates(bucket, update_buf_.data());
  // Pass 3: X = X (1 - alpha wd) - alpha / max(1, RMS(U) / d) U, and the model's copy.
  const size_t out_size = dtype_size(in.model_dtype);
  for_each_overlap(runs_, begin, end, [&](const Run& r, size_t lo, size_t hi) {
    const size_t n = hi - lo;
    const AdafactorStats::Slot& s = *r.slot;
    const optim::Hyper& h = hyper(s);
    const double numel = static_cast<double>(s.t.numel);
    const double rms_u = std::sqrt(update_buf_[s.update_at] / numel);
    const double rms_x = std::sqrt(stats_buf_[s.squares_at] / numel);
    const double alpha = step_size(h, rms_x);
    const float decay = static_cast<float>(1.0 - alpha * optim::decimal_double(h.weight_decay));
    const float scale =
        static_cast<float>(alpha / std::fmax(1.0, rms_u / optim::decimal_double(h.adafactor.clip_threshold)));
    float* w = in.master + (lo - begin);
    const float* u = u_.data() + (lo - begin);
    if (r.m_at == SIZE_MAX) {
      for (size_t k = 0; k < n; ++k) {
        const float decayed = w[k] * decay;
        w[k] = decayed - scale * u[k];
      }
    } else {
      const float b1 = h.adafactor.beta1, rest1 = static_cast<float>(1.0 - optim::decimal_double(b1));
      float* mm = m() + r.m_at + (lo - r.begin);
      for (size_t k = 0; k < n; ++k) {
        mm[k] = mm[k] * b1 + rest1 * (scale * u[k]);
        const float decayed = w[k] * decay;
        w[k] = decayed - mm[k];
      }
    }
    if (in.model_out != nullptr) {
      memory::host_kernels::convert(w, DType::kFloat32, static_cast<char*>(in.model_out) + (lo - begin) * out_size,
                                    in.model_dtype, n);
    }
  });
}

double AdafactorUpdate::beta2(const optim::Hyper& h) const {
  return 1.0 - std::pow(static_cast<double>(step_), -optim::decimal_double(h.adafactor.decay_rate));
}

double AdafactorUpdate::step_size(const optim::Hyper& h, double param_rms) const {
  const double lr = optim::decimal_double(h.lr);
  if (!h.adafactor.relative_step) return lr;
  const double rho = std::fmin(1e-2, 1.0 / std::sqrt(static_cast<double>(step_)));
  return std::fmax(optim::decimal_double(h.adafactor.eps2), param_rms) * rho;
}

bool AdafactorUpdate::keeps(const std::string& state) {
  return state == "exp_avg_sq" || state == "exp_avg_sq_row" || state == "exp_avg_sq_col" || state == "exp_avg_update";
}

float* AdafactorUpdate::state_at(const std::string& name, const Run& r, size_t x) {
  if (name == "exp_avg_update") return r.m_at == SIZE_MAX ? nullptr : m() + r.m_at + (x - r.begin);
  const AdafactorStats::Slot& s = *r.slot;
  if (s.t.rows == 0) return name == "exp_avg_sq" ? v() + r.v_at + (x - r.begin) : nullptr;
  if (name == "exp_avg_sq") return nullptr;
  size_t e = 0;
  for_each_whole(r, x, 1, [&](size_t, size_t whole) { e = whole; });
  const Matrix& m = matrices_[matrix_of_[s.index]];
  return name == "exp_avg_sq_row" ? rc() + m.r_at + e / s.t.cols : rc() + m.c_at + e % s.t.cols;
}

StateEncoding AdafactorUpdate::state_encoding(const std::string& name, size_t begin, size_t) const {
  StateEncoding e;
  for_each_overlap(runs_, begin, begin + 1, [&](const Run& r, size_t lo, size_t) {
    // The registered tensor (a tp part, or the whole) as a matrix: R is constant along each of its
    // rows and C periodic along them, whichever way a split cut the whole.
    const optim::Segment& seg = *r.segment;
    if (r.slot->t.rows == 0 || seg.cols == 0) return;
    if (name == "exp_avg_sq_row") {
      const size_t at = seg.param_offset + (lo - r.begin);  // the piece's first element in the tensor
      e = {.kind = StateEncoding::Kind::kBlockConstant, .block = seg.cols, .phase = at % seg.cols};
    } else if (name == "exp_avg_sq_col") {
      e = {.kind = StateEncoding::Kind::kPeriodic, .block = seg.cols};
    }
  });
  return e;
}

void AdafactorUpdate::read_state(const std::string& name, size_t begin, size_t n, float* out) {
  if (meta_) return;
  for_each_overlap(runs_, begin, begin + n, [&](const Run& r, size_t lo, size_t hi) {
    for (size_t x = lo; x < hi; ++x) {
      if (const float* at = state_at(name, r, x)) out[x - begin] = *at;
    }
  });
}

void AdafactorUpdate::write_state(const std::string& name, size_t begin, size_t n, const float* in) {
  if (meta_) return;
  if ((name == "exp_avg_sq_row" || name == "exp_avg_sq_col") && !written_) {
    std::fill(rc(), rc() + rc_numel_, 0.0f);  // what this load does not write is zero (see loaded())
    written_ = true;
  }
  for_each_overlap(runs_, begin, begin + n, [&](const Run& r, size_t lo, size_t hi) {
    for (size_t x = lo; x < hi; ++x) {
      if (float* at = state_at(name, r, x)) *at = in[x - begin];
    }
  });
}

size_t AdafactorUpdate::state_bytes() const { return (rc_numel_ + v_numel_ + m_numel_) * sizeof(float); }

size_t AdafactorUpdate::numel() const {
  size_t n = 0;
  for (const Run& r : runs_) n += r.end - r.begin;
  return n;
}

}  // namespace zero
