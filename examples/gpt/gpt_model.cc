#include "examples/gpt/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "base/check.h"
#include "parallel/tensor/tp_regions.h"

namespace zero::examples {
namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const Matrix>;
using Map = Eigen::Map<Matrix>;
using RowVector = Eigen::Matrix<float, 1, Eigen::Dynamic>;
using ConstRowMap = Eigen::Map<const RowVector>;
using RowMap = Eigen::Map<RowVector>;

constexpr float kLayerNormEps = 1e-5f;
const float kGeluC = std::sqrt(2.0f / static_cast<float>(M_PI));

// y = x W^T + b, W [out, in].
Matrix linear(const Matrix& x, const float* w, const float* b, int out) {
  const ConstMap W(w, out, x.cols());
  Matrix y = x * W.transpose();
  y.rowwise() += ConstRowMap(b, out);
  return y;
}

// A linear layer's backward in its two parts: dx = dy W (input), and dW += dy^T x, db += the column
// sums of dy (weight).
Matrix linear_backward_input(const Matrix& dy, const float* w, Eigen::Index in) { return dy * ConstMap(w, dy.cols(), in); }
void linear_backward_weight(const Matrix& dy, const Matrix& x, float* dw, float* db) {
  Map(dw, dy.cols(), x.cols()).noalias() += dy.transpose() * x;
  RowMap(db, dy.cols()) += dy.colwise().sum();
}
size_t matrix_bytes(Eigen::Index rows, Eigen::Index cols) { return static_cast<size_t>(rows * cols) * sizeof(float); }
size_t matrix_bytes(const Matrix& m) { return matrix_bytes(m.rows(), m.cols()); }

// The model's tensor-parallel preconditions (the constructor's, and micro_batch_bytes's).
void check_tp(const GptConfig& c, int tp, bool sequence_parallel) {
  if (c.n_head % tp != 0) {
    ZERO_THROW(InvalidArgument, "tensor parallelism: n_head {} does not divide by tp {} (each rank holds whole heads)",
               c.n_head, tp);
  }
  if (sequence_parallel && tp == 1) {
    ZERO_THROW(InvalidArgument, "sequence parallelism needs tensor parallelism (tp > 1; tp is {})", tp);
  }
}

}  // namespace

std::vector<Gpt::ParamLayout> Gpt::layout(const GptConfig& c) {
  ZERO_CHECK(c.n_embd % c.n_head == 0, "n_embd {} is not a multiple of n_head {}", c.n_embd, c.n_head);
  std::vector<ParamLayout> out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, int unit, bool decay, float std_dev, float fill) {
    out.push_back({name, std::move(shape), unit, decay, std_dev, fill});
  };
  const int64_t C = c.n_embd;
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(c.n_layer));
  add("wte.weight", {c.vocab_size, C}, 0, true, 0.02f, 0);
  add("wpe.weight", {c.block_size, C}, 0, true, 0.02f, 0);
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    const int u = 1 + i;
    add(h + "ln_1.weight", {C}, u, false, 0, 1);
    add(h + "ln_1.bias", {C}, u, false, 0, 0);
    add(h + "attn.c_attn.weight", {3 * C, C}, u, true, 0.02f, 0);
    add(h + "attn.c_attn.bias", {3 * C}, u, false, 0, 0);
    add(h + "attn.c_proj.weight", {C, C}, u, true, proj_std, 0);
    add(h + "attn.c_proj.bias", {C}, u, false, 0, 0);
    add(h + "ln_2.weight", {C}, u, false, 0, 1);
    add(h + "ln_2.bias", {C}, u, false, 0, 0);
    add(h + "mlp.c_fc.weight", {4 * C, C}, u, true, 0.02f, 0);
    add(h + "mlp.c_fc.bias", {4 * C}, u, false, 0, 0);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, u, true, proj_std, 0);
    add(h + "mlp.c_proj.bias", {C}, u, false, 0, 0);
  }
  add("ln_f.weight", {C}, c.n_layer + 1, false, 0, 1);
  add("ln_f.bias", {C}, c.n_layer + 1, false, 0, 0);
  return out;
}

Gpt::Gpt(const GptConfig& c, uint64_t seed)
    : config_(c), stage_{0, c.n_layer, true, true}, vocab_(parallel::vocab_range(c.vocab_size, 0, 1)) {
  std::mt19937_64 rng(seed);
  for (const ParamLayout& l : layout(c)) {
    size_t n = 1;
    for (int64_t d : l.shape) n *= static_cast<size_t>(d);
    Param p{l.name, l.shape, std::vector<float>(n, l.fill), l.decay, l.unit};
    if (l.std_dev > 0) {
      std::normal_distribution<float> normal(0.0f, l.std_dev);
      for (float& v : p.values) v = normal(rng);
    }
    local_.push_back(static_cast<int64_t>(params_.size()));
    params_.push_back(std::move(p));
  }
}

TpPlacement Gpt::placement(const std::string& name, bool sequence_parallel) {
  auto ends_with = [&](const char* suffix) {
    const std::string x(suffix);
    return name.size() >= x.size() && name.compare(name.size() - x.size(), x.size(), x) == 0;
  };
  if (name == "wte.weight") return TpPlacement::split(0);  // the vocabulary
  if (ends_with("attn.c_attn.weight") || ends_with("attn.c_attn.bias")) return TpPlacement::split(0, 3);
  if (ends_with("mlp.c_fc.weight") || ends_with("mlp.c_fc.bias")) return TpPlacement::split(0);
  if (ends_with("c_proj.weight")) return TpPlacement::split(1);
  // LayerNorms, wpe, the row-parallel biases: whole on every rank; under sequence parallelism each
  // rank's gradient covers its part of the sequence only.
  return sequence_parallel ? TpPlacement::replicated_partial() : TpPlacement::replicated();
}

Gpt::Gpt(const Gpt& full, const GptParallel& parallel)
    : Gpt(full, parallel, GptStage{0, full.config_.n_layer, true, true}) {}

Gpt::Gpt(const Gpt& full, const GptParallel& parallel, const GptStage& stage)
    : config_(full.config_), parallel_(parallel), stage_(stage) {
  ZERO_CHECK(full.tp_size() == 1 && full.params_.size() == full.local_.size(),
             "Gpt(full, ...): the model given is already split");
  const int n_layer = config_.n_layer;
  if (stage.first_layer < 0 || stage.first_layer > stage.end_layer || stage.end_layer > n_layer) {
    ZERO_THROW(InvalidArgument, "pipeline stage: layers [{}, {}) outside the model's [0, {}]", stage.first_layer,
               stage.end_layer, n_layer);
  }
  if (stage.first_layer == stage.end_layer && !stage.first && !stage.last) {
    ZERO_THROW(InvalidArgument, "pipeline stage: layers [{}, {}) hold no block, and the stage is neither the first nor "
               "the last: it would hold nothing", stage.first_layer, stage.end_layer);
  }
  const int tp = tp_size(), r = tp_rank();
  check_tp(config_, tp, parallel.sequence_parallel);
  vocab_ = parallel::vocab_range(config_.vocab_size, r, tp);
  local_.assign(full.params_.size(), -1);
  for (size_t i = 0; i < full.params_.size(); ++i) {
    if (!holds(config_, stage, i)) continue;
    const Param& p = full.params_[i];
    Param part = p;
    part.tp = placement(p.name, parallel.sequence_parallel);
    part.tied = i == 0 && stage.first != stage.last;  // wte held by two stages
    std::vector<int64_t> shape = p.shape;
    std::vector<float> whole = p.values;
    if (p.name == "wte.weight") {  // the padding rows: zero, and they stay so (no gradient)
      shape[0] = vocab_.padded;
      whole.resize(static_cast<size_t>(vocab_.padded * config_.n_embd), 0.0f);
    }
    part.shape = local_shape(p.name, shape, part.tp, tp);
    part.values.resize(static_cast<size_t>(std::accumulate(part.shape.begin(), part.shape.end(), int64_t{1},
                                                            std::multiplies<>())));
    shard(whole.data(), shape, part.tp, r, tp, part.values.data());
    local_[i] = static_cast<int64_t>(params_.size());
    params_.push_back(std::move(part));
  }
}

bool Gpt::holds(const GptConfig& config, const GptStage& stage, size_t i) {
  // wte on the first stage (the embedding) and the last (the tied head); wpe on the first; the
  // blocks of the range; ln_f on the last.
  const size_t lnf = 2 + static_cast<size_t>(config.n_layer) * 12;
  if (i == 0) return stage.first || stage.last;
  if (i == 1) return stage.first;
  if (i >= lnf) return stage.last;
  const int layer = static_cast<int>((i - 2) / 12);
  return layer >= stage.first_layer && layer < stage.end_layer;
}

size_t Gpt::local(size_t full_index) const {
  ZERO_CHECK(full_index < local_.size() && local_[full_index] >= 0,
             "parameter {} of the full model is not on this pipeline stage (layers [{}, {}))", full_index,
             stage_.first_layer, stage_.end_layer);
  return static_cast<size_t>(local_[full_index]);
}

std::vector<int> Gpt::units() const {
  std::vector<int> out;
  for (const Param& p : params_) {
    if (out.empty() || out.back() != p.unit) out.push_back(p.unit);
  }
  return out;
}

size_t Gpt::num_params() const {
  size_t n = 0;
  for (const Param& p : params_) n += p.values.size();
  return n;
}

namespace {

Matrix layer_norm(const Matrix& x, const float* w, const float* b, Matrix* xhat, Eigen::VectorXf* rstd) {
  const Eigen::Index C = x.cols();
  const Eigen::VectorXf mean = x.rowwise().mean();
  Matrix centered = x.colwise() - mean;
  const Eigen::VectorXf var = centered.array().square().rowwise().sum() / static_cast<float>(C);
  *rstd = (var.array() + kLayerNormEps).rsqrt();
  *xhat = centered.array().colwise() * rstd->array();
  Matrix y = xhat->array().rowwise() * ConstRowMap(w, C).array();
  y.rowwise() += ConstRowMap(b, C);
  return y;
}

// LayerNorm's backward in its two parts: the input's gradient, and the weight's and bias's.
Matrix layer_norm_backward_input(const Matrix& dy, const Matrix& xhat, const Eigen::VectorXf& rstd, const float* w) {
  const Eigen::Index C = dy.cols();
  const Matrix dxhat = dy.array().rowwise() * ConstRowMap(w, C).array();
  const Eigen::VectorXf mean_d = dxhat.rowwise().mean();
  const Eigen::VectorXf mean_dx = (dxhat.array() * xhat.array()).rowwise().mean();
  Matrix dx = dxhat.colwise() - mean_d;
  dx.array() -= xhat.array().colwise() * mean_dx.array();
  dx.array().colwise() *= rstd.array();
  return dx;
}

// A LayerNorm's weight gradient in two steps: its column sums (from the output gradient and the
// normalized input, in the input part, so that neither is kept), then their addition (the weight
// part). A whole backward takes the same two steps: the same bits either way.
struct LayerNormSums {
  RowVector dw, db;
};
LayerNormSums layer_norm_weight_sums(const Matrix& dy, const Matrix& xhat) {
  return {(dy.array() * xhat.array()).colwise().sum().matrix(), dy.colwise().sum()};
}
void add_layer_norm_sums(const LayerNormSums& sums, float* dw, float* db) {
  RowMap(dw, sums.dw.size()) += sums.dw;
  RowMap(db, sums.db.size()) += sums.db;
}

float gelu(float x) { return 0.5f * x * (1.0f + std::tanh(kGeluC * (x + 0.044715f * x * x * x))); }

float gelu_grad(float x) {
  const float t = std::tanh(kGeluC * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * 0.044715f * x * x);
}

}  // namespace

namespace {

// q, k and v of `heads` heads of hd columns each in qkv [rows, 3 * width]: q at column 0, k at
// width, v at 2 * width (width = heads * hd: this rank's part under tensor parallelism).
struct QkvLayout {
  int heads, hd, width;
};

}  // namespace

int Gpt::rows_held() const {
  const int BT = cur_->B * cur_->T;
  return parallel_.sequence_parallel ? BT / tp_size() : BT;
}

parallel::SequenceShape Gpt::sequence_shape(Eigen::Index cols) const {
  return {static_cast<size_t>(cur_->B), static_cast<size_t>(cur_->T), static_cast<size_t>(cols)};
}

Matrix Gpt::enter_region(const Matrix& x) const {
  if (!parallel_.sequence_parallel) return x;  // f: the identity
  Matrix full(cur_->B * cur_->T, x.cols());
  parallel::GatherFromSequence::forward(*parallel_.tp, x.data(), full.data(), sequence_shape(x.cols()));
  return full;
}

Matrix Gpt::enter_region_backward(Matrix&& dx_full) const {
  if (parallel_.tp == nullptr) return std::move(dx_full);
  if (!parallel_.sequence_parallel) {
    parallel::CopyToTp::backward(*parallel_.tp, dx_full.data(), static_cast<size_t>(dx_full.size()));
    return std::move(dx_full);
  }
  Matrix dx(rows_held(), dx_full.cols());
  parallel::GatherFromSequence::backward(*parallel_.tp, dx_full.data(), dx.data(), sequence_shape(dx.cols()));
  return dx;
}

Matrix Gpt::leave_region(Matrix&& partial) const {
  if (parallel_.tp == nullptr) return std::move(partial);
  if (!parallel_.sequence_parallel) {
    parallel::ReduceFromTp::forward(*parallel_.tp, partial.data(), static_cast<size_t>(partial.size()));
    return std::move(partial);
  }
  Matrix y(rows_held(), partial.cols());
  parallel::ReduceScatterToSequence::forward(*parallel_.tp, partial.data(), y.data(), sequence_shape(y.cols()));
  return y;
}

Matrix Gpt::leave_region_backward(const Matrix& dy) const {
  if (!parallel_.sequence_parallel) return dy;  // g backward: the identity
  Matrix full(cur_->B * cur_->T, dy.cols());
  parallel::ReduceScatterToSequence::backward(*parallel_.tp, dy.data(), full.data(), sequence_shape(dy.cols()));
  return full;
}

int Gpt::position_of_row(int row, int T) const {
  // Under sequence parallelism this rank holds positions [r T/tp, (r+1) T/tp) of every sequence.
  const int held = parallel_.sequence_parallel ? T / tp_size() : T;
  const int first = parallel_.sequence_parallel ? tp_rank() * held : 0;
  return first + row % held;
}

void Gpt::embed(const std::vector<int>& tokens, const Access& access, Matrix& x) const {
  const int C = config_.n_embd, T = cur_->T, BT = cur_->B * cur_->T;
  const float* wte = value(access, p_wte());
  const float* wpe = value(access, p_wpe());
  if (parallel_.tp == nullptr) {
    x.resize(BT, C);
    for (int i = 0; i < BT; ++i) {
      const int tok = tokens[static_cast<size_t>(i)];
      ZERO_CHECK(tok >= 0 && tok < config_.vocab_size, "token {} outside the vocabulary", tok);
      x.row(i) = ConstRowMap(wte + static_cast<size_t>(tok) * C, C) + ConstRowMap(wpe + static_cast<size_t>(i % T) * C, C);
    }
    return;
  }
  // This rank's rows of the table, summed over tp (reduce-scattered along the sequence under sp).
  Matrix partial(BT, C);
  parallel::vocab_embedding_forward(vocab_, wte, C, tokens.data(), tokens.size(), partial.data());
  x = leave_region(std::move(partial));
  for (int i = 0; i < x.rows(); ++i) x.row(i) += ConstRowMap(wpe + static_cast<size_t>(position_of_row(i, cur_->T)) * C, C);
}

void Gpt::embed_backward(const Matrix& dx, const Access& access) {
  const int C = config_.n_embd, T = cur_->T, BT = cur_->B * cur_->T;
  const Activations* act = cur_;
  const size_t iwte = p_wte(), iwpe = p_wpe();
  if (parallel_.tp == nullptr) {
    weight_grad(0, [=, this](const Access& a) {
      float* dwte = a.grad(iwte);
      float* dwpe = a.grad(iwpe);
      for (int i = 0; i < BT; ++i) {
        RowMap(dwte + static_cast<size_t>(act->tokens[static_cast<size_t>(i)]) * C, C) += dx.row(i);
        RowMap(dwpe + static_cast<size_t>(i % T) * C, C) += dx.row(i);
      }
    }, access, matrix_bytes(dx));
    return;
  }
  Matrix dpartial = leave_region_backward(dx);
  const size_t bytes = matrix_bytes(dx) + matrix_bytes(dpartial);
  weight_grad(0, [=, this, dpartial = std::move(dpartial)](const Access& a) {
    float* dwpe = a.grad(iwpe);
    for (int i = 0; i < dx.rows(); ++i) RowMap(dwpe + static_cast<size_t>(position_of_row(i, T)) * C, C) += dx.row(i);
    parallel::vocab_embedding_backward(vocab_, act->tokens.data(), act->tokens.size(), C, dpartial.data(), a.grad(iwte));
  }, access, bytes);
}

float Gpt::head(const Access& access) {
  const GptConfig& c = config_;
  Activations& a = *cur_;
  const int C = c.n_embd, BT = a.B * a.T;
  if (parallel_.tp == nullptr) {
    const ConstMap wte(value(access, p_wte()), c.vocab_size, C);
    a.probs_out = a.hf * wte.transpose();
    double loss = 0;
    for (int i = 0; i < BT; ++i) {
      auto row = a.probs_out.row(i);
      const float mx = row.maxCoeff();
      row = (row.array() - mx).exp();
      const float sum = row.sum();
      row /= sum;
      const int y = a.targets[static_cast<size_t>(i)];
      ZERO_CHECK(y >= 0 && y < c.vocab_size, "target {} outside the vocabulary", y);
      loss -= std::log(static_cast<double>(row(y)));
    }
    return static_cast<float>(loss / BT);
  }
  // This rank's columns of the logits only; the loss from three sums over tp.
  const ConstMap wte(value(access, p_wte()), vocab_.rows(), C);
  const Matrix logits = a.hf * wte.transpose();
  return a.loss.forward(*parallel_.tp, vocab_, logits.data(), a.targets.data(), static_cast<size_t>(BT));
}

Matrix Gpt::head_backward(float loss_scale, const Access& access) {
  const GptConfig& c = config_;
  Activations& a = *cur_;
  const int C = c.n_embd, BT = a.B * a.T;
  const Matrix* hf = &a.hf;
  const size_t iwte = p_wte();
  Matrix dlogits;
  if (parallel_.tp == nullptr) {
    dlogits = a.probs_out;
    for (int i = 0; i < BT; ++i) dlogits(i, a.targets[static_cast<size_t>(i)]) -= 1.0f;
    dlogits *= loss_scale / static_cast<float>(BT);
  } else {
    dlogits.resize(BT, vocab_.rows());
    a.loss.backward(loss_scale, dlogits.data());
  }
  const Eigen::Index rows = parallel_.tp == nullptr ? c.vocab_size : vocab_.rows();
  Matrix dx = dlogits * ConstMap(value(access, iwte), rows, C);
  const size_t bytes = matrix_bytes(dlogits);
  weight_grad(0, [=, dlogits = std::move(dlogits)](const Access& w) {
    Map(w.grad(iwte), rows, C).noalias() += dlogits.transpose() * *hf;
  }, access, bytes);
  return parallel_.tp == nullptr ? dx : enter_region_backward(std::move(dx));
}

Gpt::Activations& Gpt::begin_micro_batch(int mb, const std::vector<int>& tokens, const std::vector<int>& targets, int B,
                                         int T) {
  const GptConfig& c = config_;
  ZERO_CHECK(T >= 1 && T <= c.block_size, "sequence length {} outside [1, {}]", T, c.block_size);
  ZERO_CHECK_EQ(tokens.size(), static_cast<size_t>(B) * T);
  ZERO_CHECK_EQ(targets.size(), static_cast<size_t>(B) * T);
  if (parallel_.sequence_parallel) {
    (void)parallel::SequenceShape{static_cast<size_t>(B), static_cast<size_t>(T), 1}.local_count(tp_size());
  }
  Activations& a = acts_[mb];
  a = Activations{};
  a.B = B;
  a.T = T;
  a.tokens = tokens;
  a.targets = targets;
  cur_ = &a;
  return a;
}

size_t Gpt::activation_numel(int B, int T) const {
  const size_t rows = static_cast<size_t>(B) * static_cast<size_t>(T);
  return (parallel_.sequence_parallel ? rows / static_cast<size_t>(tp_size()) : rows) * static_cast<size_t>(config_.n_embd);
}

size_t Gpt::Activations::bytes() const {
  size_t n = matrix_bytes(hf) + matrix_bytes(probs_out) + matrix_bytes(lnf.xhat) + weight_work_bytes;
  for (const BlockCache& k : blocks) {
    for (const Matrix* m : {&k.input, &k.h1, &k.qkv, &k.att_y, &k.h2, &k.fc, &k.gelu, &k.ln1.xhat, &k.ln2.xhat}) {
      n += matrix_bytes(*m);
    }
    for (const Matrix& p : k.probs) n += matrix_bytes(p);
  }
  return n;
}

Gpt::MicroBatchBytes Gpt::micro_batch_bytes(const GptConfig& c, const GptStage& stage, int tp, bool sequence_parallel,
                                             int B, int T, bool recompute) {
  ZERO_CHECK(tp >= 1, "tp {} is not positive", tp);
  check_tp(c, tp, sequence_parallel);
  ZERO_CHECK(T >= 1 && T <= c.block_size, "sequence length {} outside [1, {}]", T, c.block_size);
  if (sequence_parallel) {
    (void)parallel::SequenceShape{static_cast<size_t>(B), static_cast<size_t>(T), 1}.local_count(tp);
  }
  // The shapes of forward_micro_batch and backward_micro_batch: `held` rows of the residual stream
  // (rows_held()), BT of a region's input (gathered under sp), this rank's heads and columns.
  const Eigen::Index C = c.n_embd, BT = static_cast<Eigen::Index>(B) * T;
  const Eigen::Index held = sequence_parallel ? BT / tp : BT;
  const Eigen::Index heads = c.n_head / tp, width = C / tp, hidden = 4 * C / tp;
  const auto blocks = static_cast<size_t>(stage.end_layer - stage.first_layer);
  MicroBatchBytes out;
  // BlockCache: ln1 and ln2 xhat (held rows), h1 and h2 (gathered), qkv, att_y, fc, gelu, and the
  // probabilities of each (b, head).
  const size_t block = 2 * matrix_bytes(held, C) + 2 * matrix_bytes(BT, C) + matrix_bytes(BT, 3 * width) +
                       matrix_bytes(BT, width) + 2 * matrix_bytes(BT, hidden) +
                       static_cast<size_t>(B * heads) * matrix_bytes(T, T);
  // What a block's weight part reads and keeps: the four linear layers' inputs (h1, att_y, h2,
  // gelu); the two row-parallel biases' and the two LayerNorms' column sums (six rows of C); the
  // two row-parallel weights' gathered output gradients, c_fc's and c_attn's.
  const size_t reads = 2 * matrix_bytes(BT, C) + matrix_bytes(BT, width) + matrix_bytes(BT, hidden);
  const size_t work = 6 * matrix_bytes(1, C) + 2 * matrix_bytes(BT, C) + matrix_bytes(BT, hidden) +
                      matrix_bytes(BT, 3 * width);
  const size_t input = matrix_bytes(held, C);  // a block's input (held rows), kept under recompute
  out.forward = blocks * (recompute ? input : block);
  out.weight = blocks * (reads + work);
  if (recompute && blocks > 0) out.rebuilt = block;
  // The last stage: lnf.xhat (held rows), hf (gathered), probs_out (the whole vocabulary, at tp 1
  // only) after the forward; its weight part keeps hf, the head's logit gradients (this rank's rows
  // of the padded vocabulary) and ln_f's two sums.
  size_t head_forward = 0, head_weight = 0;
  if (stage.last) {
    const Eigen::Index vocab_rows = parallel::vocab_range(c.vocab_size, 0, tp).rows();
    head_forward = matrix_bytes(held, C) + matrix_bytes(BT, C) + (tp == 1 ? matrix_bytes(BT, c.vocab_size) : 0);
    head_weight = matrix_bytes(BT, C) + matrix_bytes(BT, vocab_rows) + 2 * matrix_bytes(1, C);
    out.forward += head_forward;
    out.weight += head_weight;
  }
  // The first stage's weight part: wpe's gradient (held rows), and under tp the vocab-parallel
  // embedding's whole one.
  if (stage.first) out.weight += matrix_bytes(held, C) + (tp > 1 ? matrix_bytes(BT, C) : 0);
  // An input part under recompute, at its last block's rebuild: the head's change (its weight part's
  // keep for its forward's), each block before it traded its input for its weight part's keep, and
  // the rebuilt block.
  if (recompute && blocks > 0) {
    const auto peak = static_cast<int64_t>(head_weight) - static_cast<int64_t>(head_forward) +
                      static_cast<int64_t>((blocks - 1) * (reads + work - input) + block);
    out.input_peak = static_cast<size_t>(std::max<int64_t>(0, peak));
  }
  return out;
}

size_t Gpt::activation_bytes() const {
  size_t n = 0;
  for (const auto& [mb, a] : acts_) n += a.bytes();
  return n;
}

void Gpt::note_activation_bytes() { peak_activation_bytes_ = std::max(peak_activation_bytes_, activation_bytes()); }

void Gpt::weight_grad(int unit, std::function<void(const Access&)> work, const Access& access, size_t bytes) {
  if (with_weight_) {
    work(access);
    return;
  }
  auto& list = cur_->weight_work;
  auto it = std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.first == unit; });
  if (it == list.end()) it = list.insert(list.end(), {unit, {}});
  it->second.push_back(std::move(work));
  cur_->weight_work_bytes += bytes;
}

void Gpt::block_forward(int l, Matrix& x, BlockCache& k, const Access& access) {
  const GptConfig& c = config_;
  const int tp = tp_size();
  const int B = cur_->B, T = cur_->T, C = c.n_embd, hd = C / c.n_head, BT = B * T;
  const QkvLayout qkv{c.n_head / tp, hd, C / tp};
  const int hidden = 4 * C / tp;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto P = [&](int j) { return value(access, p_block(l, j)); };
  k.h1 = enter_region(layer_norm(x, P(0), P(1), &k.ln1.xhat, &k.ln1.rstd));
  k.qkv = linear(k.h1, P(2), P(3), 3 * qkv.width);
  k.att_y.resize(BT, qkv.width);
  k.probs.assign(static_cast<size_t>(B * qkv.heads), Matrix());
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < qkv.heads; ++h) {
      const auto q = k.qkv.block(b * T, h * hd, T, hd);
      const auto kk = k.qkv.block(b * T, qkv.width + h * hd, T, hd);
      const auto v = k.qkv.block(b * T, 2 * qkv.width + h * hd, T, hd);
      Matrix s = (q * kk.transpose()) * scale;
      for (int i = 0; i < T; ++i) {
        for (int j = i + 1; j < T; ++j) s(i, j) = -INFINITY;
        const float mx = s.row(i).head(i + 1).maxCoeff();
        s.row(i) = (s.row(i).array() - mx).exp();
        s.row(i) /= s.row(i).sum();
      }
      k.att_y.block(b * T, h * hd, T, hd) = s * v;
      k.probs[static_cast<size_t>(b * qkv.heads + h)] = std::move(s);
    }
  }
  // Row-parallel: the partial products summed over tp, then the bias once.
  Matrix y = leave_region(k.att_y * ConstMap(P(4), C, qkv.width).transpose());
  y.rowwise() += ConstRowMap(P(5), C);
  x += y;
  k.h2 = enter_region(layer_norm(x, P(6), P(7), &k.ln2.xhat, &k.ln2.rstd));
  k.fc = linear(k.h2, P(8), P(9), hidden);
  k.gelu = k.fc.unaryExpr([](float v) { return gelu(v); });
  Matrix m = leave_region(k.gelu * ConstMap(P(10), C, hidden).transpose());
  m.rowwise() += ConstRowMap(P(11), C);
  x += m;
}

float Gpt::forward(const std::vector<int>& tokens, const std::vector<int>& targets, int B, int T,
                   const Access& access) {
  ZERO_CHECK(stage_.first && stage_.last, "forward(): this model is one pipeline stage; use forward_micro_batch");
  return forward_micro_batch(0, tokens, targets, B, T, nullptr, nullptr, access);
}

float Gpt::forward_micro_batch(int mb, const std::vector<int>& tokens, const std::vector<int>& targets, int B, int T,
                               const float* input, std::vector<float>* output, const Access& access) {
  const GptConfig& c = config_;
  Activations& a = begin_micro_batch(mb, tokens, targets, B, T);
  const int C = c.n_embd;

  Matrix x;
  if (stage_.first) {
    access.enter(0, Pass::kForward);
    embed(tokens, access, x);
    access.leave(0, Pass::kForward);
  } else {
    ZERO_CHECK(input != nullptr, "forward of micro-batch {}: a stage after the first needs its input", mb);
    x = ConstMap(input, rows_held(), C);
  }

  a.blocks.assign(static_cast<size_t>(stage_.end_layer - stage_.first_layer), BlockCache{});
  for (int l = stage_.first_layer; l < stage_.end_layer; ++l) {
    access.enter(1 + l, Pass::kForward);
    BlockCache& k = a.blocks[static_cast<size_t>(l - stage_.first_layer)];
    if (recompute_) {
      // Only the block's input is kept; its backward rebuilds the rest.
      k.input = x;
      block_forward(l, x, k, access);
      k.keep_input_only();
    } else {
      block_forward(l, x, k, access);
    }
    access.leave(1 + l, Pass::kForward);
  }

  if (!stage_.last) {
    ZERO_CHECK(output != nullptr, "forward of micro-batch {}: a stage before the last needs an output", mb);
    output->assign(x.data(), x.data() + x.size());
    note_activation_bytes();
    return 0.0f;
  }
  access.enter(c.n_layer + 1, Pass::kForward);
  a.hf = enter_region(layer_norm(x, value(access, p_lnf(0)), value(access, p_lnf(1)), &a.lnf.xhat, &a.lnf.rstd));
  access.leave(c.n_layer + 1, Pass::kForward);

  // The head, tied to wte: unit 0 again.
  access.enter(0, Pass::kForward);
  const float loss = head(access);
  access.leave(0, Pass::kForward);
  note_activation_bytes();
  return loss;
}

void Gpt::backward(float loss_scale, const Access& access) {
  ZERO_CHECK(stage_.first && stage_.last, "backward(): this model is one pipeline stage; use backward_micro_batch");
  backward_micro_batch(0, loss_scale, nullptr, nullptr, true, access);
}

void Gpt::backward_micro_batch(int mb, float loss_scale, const float* grad_output, std::vector<float>* grad_input,
                               bool with_weight, const Access& access) {
  const auto found = acts_.find(mb);
  ZERO_CHECK(found != acts_.end(), "backward of micro-batch {} before its forward", mb);
  Activations& a = found->second;
  cur_ = &a;
  with_weight_ = with_weight;
  const Pass pass = backward_pass();
  const GptConfig& c = config_;
  const int B = a.B, T = a.T, C = c.n_embd, hd = C / c.n_head, BT = B * T;
  const int tp = tp_size();
  const QkvLayout qkv{c.n_head / tp, hd, C / tp};
  const int hidden = 4 * C / tp;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  Matrix dx;
  // The whole model's unit 0 backward scope spans the whole backward: the head's part of dwte
  // first, the embeddings' last.
  bool unit0_open = false;
  if (stage_.last) {
    access.enter(0, pass);
    dx = head_backward(loss_scale, access);
    if (stage_.first) {
      unit0_open = true;
    } else {
      access.leave(0, pass);
    }
    access.enter(c.n_layer + 1, pass);
    const size_t iw = p_lnf(0), ib = p_lnf(1);
    Matrix dn = layer_norm_backward_input(dx, a.lnf.xhat, a.lnf.rstd, value(access, iw));
    weight_grad(c.n_layer + 1, [iw, ib, sums = layer_norm_weight_sums(dx, a.lnf.xhat)](const Access& w) {
      add_layer_norm_sums(sums, w.grad(iw), w.grad(ib));
    }, access, 2 * static_cast<size_t>(C) * sizeof(float));
    dx = std::move(dn);
    access.leave(c.n_layer + 1, pass);
    if (!with_weight) {  // the weight part reads hf and the logits' gradient only
      a.probs_out = Matrix();
      a.lnf = LayerNormCache{};
    }
  } else {
    ZERO_CHECK(grad_output != nullptr, "backward of micro-batch {}: a stage before the last needs its output's gradient",
               mb);
    dx = ConstMap(grad_output, rows_held(), C);
  }

  for (int l = stage_.end_layer - 1; l >= stage_.first_layer; --l) {
    const int u = 1 + l;
    access.enter(u, pass);
    BlockCache* k = &a.blocks[static_cast<size_t>(l - stage_.first_layer)];
    if (recompute_) {
      // The block's forward again, inside its backward scope (where the engine has its parameters,
      // gathered at stage 3): the same inputs and parameters give the same bits.
      Matrix x = k->input;
      block_forward(l, x, *k, access);
      note_activation_bytes();
    }
    auto P = [&](int j) { return value(access, p_block(l, j)); };
    auto I = [&](int j) { return p_block(l, j); };
    // The weight-gradient work of the block's layers (now, or kept for the weight pass): a bias
    // that saw `dy`; a linear layer's weight and bias (j, j + 1) from its output gradient and input;
    // a LayerNorm's from its output gradient and normalized input.
    auto bias = [&](int j, const Matrix& dy) {
      weight_grad(u, [i = I(j), C, db = RowVector(dy.colwise().sum())](const Access& w) { RowMap(w.grad(i), C) += db; },
                  access, static_cast<size_t>(C) * sizeof(float));
    };
    auto linear = [&](int j, Matrix&& dy, const Matrix* x) {
      const size_t bytes = matrix_bytes(dy);
      weight_grad(u, [iw = I(j), ib = I(j + 1), x, dy = std::move(dy)](const Access& w) {
        linear_backward_weight(dy, *x, w.grad(iw), w.grad(ib));
      }, access, bytes);
    };
    auto norm = [&](int j, const Matrix& dy, const Matrix& xhat) {
      weight_grad(u, [iw = I(j), ib = I(j + 1), sums = layer_norm_weight_sums(dy, xhat)](const Access& w) {
        add_layer_norm_sums(sums, w.grad(iw), w.grad(ib));
      }, access, 2 * static_cast<size_t>(C) * sizeof(float));
    };
    // Row-parallel projections: their bias added once after the sum over tp (it saw dx), their
    // weight the whole (gathered) output gradient.
    auto row_parallel = [&](int j, Matrix&& dy, const Matrix* x, Eigen::Index in) {
      const size_t bytes = matrix_bytes(dy);
      weight_grad(u, [i = I(j), C, in, x, dy = std::move(dy)](const Access& w) {
        Map(w.grad(i), C, in).noalias() += dy.transpose() * *x;
      }, access, bytes);
    };
    // x_out = x_mid + mlp(ln_2(x_mid))
    bias(11, dx);
    Matrix dm = leave_region_backward(dx);
    const Matrix dg = dm * ConstMap(P(10), C, hidden);
    row_parallel(10, std::move(dm), &k->gelu, hidden);
    Matrix dfc = dg.array() * k->fc.unaryExpr([](float v) { return gelu_grad(v); }).array();
    Matrix dh2 = enter_region_backward(linear_backward_input(dfc, P(8), C));
    linear(8, std::move(dfc), &k->h2);
    dx += layer_norm_backward_input(dh2, k->ln2.xhat, k->ln2.rstd, P(6));
    norm(6, dh2, k->ln2.xhat);
    // x_mid = x_in + attn(ln_1(x_in))
    bias(5, dx);
    Matrix dyf = leave_region_backward(dx);
    const Matrix dy = dyf * ConstMap(P(4), C, qkv.width);
    row_parallel(4, std::move(dyf), &k->att_y, qkv.width);
    Matrix dqkv = Matrix::Zero(BT, 3 * qkv.width);
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < qkv.heads; ++h) {
        const Matrix& p = k->probs[static_cast<size_t>(b * qkv.heads + h)];
        const auto q = k->qkv.block(b * T, h * hd, T, hd);
        const auto kk = k->qkv.block(b * T, qkv.width + h * hd, T, hd);
        const auto v = k->qkv.block(b * T, 2 * qkv.width + h * hd, T, hd);
        const auto dyh = dy.block(b * T, h * hd, T, hd);
        const Matrix dp = dyh * v.transpose();
        dqkv.block(b * T, 2 * qkv.width + h * hd, T, hd) = p.transpose() * dyh;
        // softmax backward: ds = p * (dp - rowsum(dp * p)); masked entries have p = 0.
        const Eigen::VectorXf inner = (dp.array() * p.array()).rowwise().sum();
        Matrix ds = p.array() * (dp.colwise() - inner).array();
        ds *= scale;
        dqkv.block(b * T, h * hd, T, hd) = ds * kk;
        dqkv.block(b * T, qkv.width + h * hd, T, hd) = ds.transpose() * q;
      }
    }
    Matrix dh1 = enter_region_backward(linear_backward_input(dqkv, P(2), C));
    linear(2, std::move(dqkv), &k->h1);
    dx += layer_norm_backward_input(dh1, k->ln1.xhat, k->ln1.rstd, P(0));
    norm(0, dh1, k->ln1.xhat);
    // A split backward keeps what its weight part reads; a whole one has used the rebuilt block.
    if (!with_weight) {
      k->keep_for_weight();
    } else if (recompute_) {
      k->keep_input_only();
    }
    access.leave(u, pass);
  }

  if (stage_.first) {
    if (!unit0_open) access.enter(0, pass);
    embed_backward(dx, access);
    access.leave(0, pass);
  } else {
    ZERO_CHECK(grad_input != nullptr, "backward of micro-batch {}: a stage after the first needs its input's gradient", mb);
    grad_input->assign(dx.data(), dx.data() + dx.size());
  }
  if (with_weight) {
    acts_.erase(found);
  } else {
    note_activation_bytes();
  }
  cur_ = nullptr;
}

void Gpt::weight_micro_batch(int mb, const Access& access) {
  const auto found = acts_.find(mb);
  ZERO_CHECK(found != acts_.end() && !found->second.weight_work.empty(),
             "weight pass of micro-batch {} without its input pass (backward_micro_batch with with_weight false)", mb);
  for (auto& [unit, work] : found->second.weight_work) {
    access.enter(unit, Pass::kBackwardWeight);
    for (auto& w : work) w(access);
    access.leave(unit, Pass::kBackwardWeight);
  }
  acts_.erase(found);
}

std::vector<float> Gpt::last_position_logits(int mb, const Access& access) {
  ZERO_CHECK(stage_.last, "last_position_logits(): only the last pipeline stage has the head");
  const Activations& a = acts_.at(mb);
  const Eigen::Index t = a.T - 1;
  std::vector<float> out(static_cast<size_t>(config_.vocab_size));
  if (parallel_.tp == nullptr) {
    for (int v = 0; v < config_.vocab_size; ++v) out[static_cast<size_t>(v)] = std::log(a.probs_out(t, v));
    return out;
  }
  // Each rank's columns of the last position's logits, gathered; then a log-softmax.
  access.enter(0, Pass::kForward);
  const ConstMap wte(value(access, p_wte()), vocab_.rows(), config_.n_embd);
  const RowVector local = a.hf.row(t) * wte.transpose();
  access.leave(0, Pass::kForward);
  std::vector<float> all(static_cast<size_t>(vocab_.padded));
  parallel_.tp->all_gather(local.data(), all.data(), static_cast<size_t>(vocab_.rows()), DType::kFloat32)->wait();
  const float mx = *std::max_element(all.begin(), all.begin() + config_.vocab_size);
  double sum = 0;
  for (int v = 0; v < config_.vocab_size; ++v) sum += std::exp(static_cast<double>(all[static_cast<size_t>(v)] - mx));
  const auto log_sum = static_cast<float>(std::log(sum));
  for (int v = 0; v < config_.vocab_size; ++v) out[static_cast<size_t>(v)] = all[static_cast<size_t>(v)] - mx - log_sum;
  return out;
}

std::vector<float> Gpt::next_logits(const std::vector<int>& context, const Access& access) {
  ZERO_CHECK(!context.empty(), "an empty context");
  const size_t T = std::min(context.size(), static_cast<size_t>(config_.block_size));
  const std::vector<int> window(context.end() - static_cast<std::ptrdiff_t>(T), context.end());
  // A forward with dummy targets, kept apart from the training micro-batches.
  constexpr int kSampling = -1;
  forward_micro_batch(kSampling, window, std::vector<int>(T, 0), 1, static_cast<int>(T), nullptr, nullptr, access);
  std::vector<float> out = last_position_logits(kSampling, access);
  forget(kSampling);
  return out;
}

}  // namespace zero::examples
