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

// dx = dy W; dW += dy^T x; db += column sums of dy.
Matrix linear_backward(const Matrix& dy, const Matrix& x, const float* w, float* dw, float* db) {
  const ConstMap W(w, dy.cols(), x.cols());
  Map(dw, dy.cols(), x.cols()).noalias() += dy.transpose() * x;
  RowMap(db, dy.cols()) += dy.colwise().sum();
  return dy * W;
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

Gpt::Gpt(const GptConfig& c, uint64_t seed) : config_(c), vocab_(parallel::vocab_range(c.vocab_size, 0, 1)) {
  std::mt19937_64 rng(seed);
  for (const ParamLayout& l : layout(c)) {
    size_t n = 1;
    for (int64_t d : l.shape) n *= static_cast<size_t>(d);
    Param p{l.name, l.shape, std::vector<float>(n, l.fill), l.decay, l.unit};
    if (l.std_dev > 0) {
      std::normal_distribution<float> normal(0.0f, l.std_dev);
      for (float& v : p.values) v = normal(rng);
    }
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

Gpt::Gpt(const Gpt& full, const GptParallel& parallel) : config_(full.config_), parallel_(parallel) {
  ZERO_CHECK(full.tp_size() == 1, "Gpt(full, parallel): the model given is already split");
  const int tp = tp_size(), r = tp_rank();
  if (config_.n_head % tp != 0) {
    ZERO_THROW(InvalidArgument, "tensor parallelism: n_head {} does not divide by tp {} (each rank holds whole heads)",
               config_.n_head, tp);
  }
  if (parallel.sequence_parallel && tp == 1) {
    ZERO_THROW(InvalidArgument, "sequence parallelism needs tensor parallelism (tp > 1; tp is {})", tp);
  }
  vocab_ = parallel::vocab_range(config_.vocab_size, r, tp);
  for (const Param& p : full.params_) {
    Param part = p;
    part.tp = placement(p.name, parallel.sequence_parallel);
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
    params_.push_back(std::move(part));
  }
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

Matrix layer_norm_backward(const Matrix& dy, const Matrix& xhat, const Eigen::VectorXf& rstd, const float* w,
                           float* dw, float* db) {
  const Eigen::Index C = dy.cols();
  RowMap(dw, C) += (dy.array() * xhat.array()).colwise().sum().matrix();
  RowMap(db, C) += dy.colwise().sum();
  const Matrix dxhat = dy.array().rowwise() * ConstRowMap(w, C).array();
  const Eigen::VectorXf mean_d = dxhat.rowwise().mean();
  const Eigen::VectorXf mean_dx = (dxhat.array() * xhat.array()).rowwise().mean();
  Matrix dx = dxhat.colwise() - mean_d;
  dx.array() -= xhat.array().colwise() * mean_dx.array();
  dx.array().colwise() *= rstd.array();
  return dx;
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
  const int BT = B_ * T_;
  return parallel_.sequence_parallel ? BT / tp_size() : BT;
}

parallel::SequenceShape Gpt::sequence_shape(Eigen::Index cols) const {
  return {static_cast<size_t>(B_), static_cast<size_t>(T_), static_cast<size_t>(cols)};
}

Matrix Gpt::enter_region(const Matrix& x) const {
  if (!parallel_.sequence_parallel) return x;  // f: the identity
  Matrix full(B_ * T_, x.cols());
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
  Matrix full(B_ * T_, dy.cols());
  parallel::ReduceScatterToSequence::backward(*parallel_.tp, dy.data(), full.data(), sequence_shape(dy.cols()));
  return full;
}

int Gpt::position_of_row(int row) const {
  // Under sequence parallelism this rank holds positions [r T/tp, (r+1) T/tp) of every sequence.
  const int held = parallel_.sequence_parallel ? T_ / tp_size() : T_;
  const int first = parallel_.sequence_parallel ? tp_rank() * held : 0;
  return first + row % held;
}

void Gpt::embed(const std::vector<int>& tokens, const Access& access, Matrix& x) const {
  const int C = config_.n_embd, T = T_, BT = B_ * T_;
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
  for (int i = 0; i < x.rows(); ++i) x.row(i) += ConstRowMap(wpe + static_cast<size_t>(position_of_row(i)) * C, C);
}

void Gpt::embed_backward(const Matrix& dx, const Access& access) {
  const int C = config_.n_embd, T = T_, BT = B_ * T_;
  float* dwte = access.grad(p_wte());
  float* dwpe = access.grad(p_wpe());
  if (parallel_.tp == nullptr) {
    for (int i = 0; i < BT; ++i) {
      RowMap(dwte + static_cast<size_t>(tokens_[static_cast<size_t>(i)]) * C, C) += dx.row(i);
      RowMap(dwpe + static_cast<size_t>(i % T) * C, C) += dx.row(i);
    }
    return;
  }
  for (int i = 0; i < dx.rows(); ++i) RowMap(dwpe + static_cast<size_t>(position_of_row(i)) * C, C) += dx.row(i);
  const Matrix dpartial = leave_region_backward(dx);
  parallel::vocab_embedding_backward(vocab_, tokens_.data(), tokens_.size(), C, dpartial.data(), dwte);
}

float Gpt::head(const Access& access) {
  const GptConfig& c = config_;
  const int C = c.n_embd, BT = B_ * T_;
  if (parallel_.tp == nullptr) {
    const ConstMap wte(value(access, p_wte()), c.vocab_size, C);
    probs_out_ = hf_ * wte.transpose();
    double loss = 0;
    for (int i = 0; i < BT; ++i) {
      auto row = probs_out_.row(i);
      const float mx = row.maxCoeff();
      row = (row.array() - mx).exp();
      const float sum = row.sum();
      row /= sum;
      const int y = targets_[static_cast<size_t>(i)];
      ZERO_CHECK(y >= 0 && y < c.vocab_size, "target {} outside the vocabulary", y);
      loss -= std::log(static_cast<double>(row(y)));
    }
    return static_cast<float>(loss / BT);
  }
  // This rank's columns of the logits only; the loss from three sums over tp.
  const ConstMap wte(value(access, p_wte()), vocab_.rows(), C);
  const Matrix logits = hf_ * wte.transpose();
  return loss_.forward(*parallel_.tp, vocab_, logits.data(), targets_.data(), static_cast<size_t>(BT));
}

Matrix Gpt::head_backward(float loss_scale, const Access& access) {
  const GptConfig& c = config_;
  const int C = c.n_embd, BT = B_ * T_;
  if (parallel_.tp == nullptr) {
    Matrix dlogits = probs_out_;
    for (int i = 0; i < BT; ++i) dlogits(i, targets_[static_cast<size_t>(i)]) -= 1.0f;
    dlogits *= loss_scale / static_cast<float>(BT);
    Map(access.grad(p_wte()), c.vocab_size, C).noalias() += dlogits.transpose() * hf_;
    return dlogits * ConstMap(value(access, p_wte()), c.vocab_size, C);
  }
  Matrix dlogits(BT, vocab_.rows());
  loss_.backward(loss_scale, dlogits.data());
  Map(access.grad(p_wte()), vocab_.rows(), C).noalias() += dlogits.transpose() * hf_;
  return enter_region_backward(dlogits * ConstMap(value(access, p_wte()), vocab_.rows(), C));
}

float Gpt::forward(const std::vector<int>& tokens, const std::vector<int>& targets, int B, int T,
                   const Access& access) {
  const GptConfig& c = config_;
  ZERO_CHECK(T >= 1 && T <= c.block_size, "sequence length {} outside [1, {}]", T, c.block_size);
  ZERO_CHECK_EQ(tokens.size(), static_cast<size_t>(B) * T);
  ZERO_CHECK_EQ(targets.size(), static_cast<size_t>(B) * T);
  if (parallel_.sequence_parallel) {
    (void)parallel::SequenceShape{static_cast<size_t>(B), static_cast<size_t>(T), 1}.local_count(tp_size());
  }
  B_ = B;
  T_ = T;
  tokens_ = tokens;
  targets_ = targets;
  const int tp = tp_size();
  const int C = c.n_embd, hd = C / c.n_head, BT = B * T;
  const QkvLayout qkv{c.n_head / tp, hd, C / tp};
  const int hidden = 4 * C / tp;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  access.enter(0, false);
  Matrix x;
  embed(tokens, access, x);
  access.leave(0, false);

  blocks_.assign(static_cast<size_t>(c.n_layer), BlockCache{});
  for (int l = 0; l < c.n_layer; ++l) {
    access.enter(1 + l, false);
    BlockCache& k = blocks_[static_cast<size_t>(l)];
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
    access.leave(1 + l, false);
  }

  access.enter(c.n_layer + 1, false);
  hf_ = enter_region(layer_norm(x, value(access, p_lnf(0)), value(access, p_lnf(1)), &lnf_.xhat, &lnf_.rstd));
  access.leave(c.n_layer + 1, false);

  // The head, tied to wte: unit 0 again.
  access.enter(0, false);
  const float loss = head(access);
  access.leave(0, false);
  return loss;
}

void Gpt::backward(float loss_scale, const Access& access) {
  const GptConfig& c = config_;
  const int B = B_, T = T_, C = c.n_embd, hd = C / c.n_head, BT = B * T;
  const int tp = tp_size();
  const QkvLayout qkv{c.n_head / tp, hd, C / tp};
  const int hidden = 4 * C / tp;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto grad = [&](size_t i) { return access.grad(i); };

  // Unit 0's backward scope spans the whole backward: the head's part of dwte first, the
  // embeddings' last.
  access.enter(0, true);
  Matrix dx = head_backward(loss_scale, access);

  access.enter(c.n_layer + 1, true);
  dx = layer_norm_backward(dx, lnf_.xhat, lnf_.rstd, value(access, p_lnf(0)), grad(p_lnf(0)), grad(p_lnf(1)));
  access.leave(c.n_layer + 1, true);

  for (int l = c.n_layer - 1; l >= 0; --l) {
    access.enter(1 + l, true);
    BlockCache& k = blocks_[static_cast<size_t>(l)];
    auto P = [&](int j) { return value(access, p_block(l, j)); };
    auto G = [&](int j) { return grad(p_block(l, j)); };
    // x_out = x_mid + mlp(ln_2(x_mid)); the row-parallel bias saw dx, the weight the whole dm.
    RowMap(G(11), C) += dx.colwise().sum();
    const Matrix dm = leave_region_backward(dx);
    Map(G(10), C, hidden).noalias() += dm.transpose() * k.gelu;
    const Matrix dg = dm * ConstMap(P(10), C, hidden);
    Matrix dfc = dg.array() * k.fc.unaryExpr([](float v) { return gelu_grad(v); }).array();
    Matrix dh2 = enter_region_backward(linear_backward(dfc, k.h2, P(8), G(8), G(9)));
    dx += layer_norm_backward(dh2, k.ln2.xhat, k.ln2.rstd, P(6), G(6), G(7));
    // x_mid = x_in + attn(ln_1(x_in))
    RowMap(G(5), C) += dx.colwise().sum();
    const Matrix dyf = leave_region_backward(dx);
    Map(G(4), C, qkv.width).noalias() += dyf.transpose() * k.att_y;
    const Matrix dy = dyf * ConstMap(P(4), C, qkv.width);
    Matrix dqkv = Matrix::Zero(BT, 3 * qkv.width);
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < qkv.heads; ++h) {
        const Matrix& p = k.probs[static_cast<size_t>(b * qkv.heads + h)];
        const auto q = k.qkv.block(b * T, h * hd, T, hd);
        const auto kk = k.qkv.block(b * T, qkv.width + h * hd, T, hd);
        const auto v = k.qkv.block(b * T, 2 * qkv.width + h * hd, T, hd);
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
    Matrix dh1 = enter_region_backward(linear_backward(dqkv, k.h1, P(2), G(2), G(3)));
    dx += layer_norm_backward(dh1, k.ln1.xhat, k.ln1.rstd, P(0), G(0), G(1));
    access.leave(1 + l, true);
  }

  embed_backward(dx, access);
  access.leave(0, true);
}

std::vector<float> Gpt::next_logits(const std::vector<int>& context, const Access& access) {
  ZERO_CHECK(!context.empty(), "an empty context");
  const size_t T = std::min(context.size(), static_cast<size_t>(config_.block_size));
  const std::vector<int> window(context.end() - static_cast<std::ptrdiff_t>(T), context.end());
  // A forward with dummy targets; the last position's probabilities, as logits (log).
  forward(window, std::vector<int>(T, 0), 1, static_cast<int>(T), access);
  std::vector<float> out(static_cast<size_t>(config_.vocab_size));
  if (parallel_.tp == nullptr) {
    for (int v = 0; v < config_.vocab_size; ++v) out[static_cast<size_t>(v)] = std::log(probs_out_(static_cast<Eigen::Index>(T) - 1, v));
    return out;
  }
  // Each rank's columns of the last position's logits, gathered; then a log-softmax.
  access.enter(0, false);
  const ConstMap wte(value(access, p_wte()), vocab_.rows(), config_.n_embd);
  const RowVector local = hf_.row(static_cast<Eigen::Index>(T) - 1) * wte.transpose();
  access.leave(0, false);
  std::vector<float> all(static_cast<size_t>(vocab_.padded));
  parallel_.tp->all_gather(local.data(), all.data(), static_cast<size_t>(vocab_.rows()), DType::kFloat32)->wait();
  const float mx = *std::max_element(all.begin(), all.begin() + config_.vocab_size);
  double sum = 0;
  for (int v = 0; v < config_.vocab_size; ++v) sum += std::exp(static_cast<double>(all[static_cast<size_t>(v)] - mx));
  const auto log_sum = static_cast<float>(std::log(sum));
  for (int v = 0; v < config_.vocab_size; ++v) out[static_cast<size_t>(v)] = all[static_cast<size_t>(v)] - mx - log_sum;
  return out;
}

}  // namespace zero::examples
