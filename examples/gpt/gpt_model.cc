#include "examples/gpt/gpt_model.h"

#include <cmath>
#include <random>

#include "base/check.h"

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

Gpt::Gpt(const GptConfig& c, uint64_t seed) : config_(c) {
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

float Gpt::forward(const std::vector<int>& tokens, const std::vector<int>& targets, int B, int T,
                   const Access& access) {
  const GptConfig& c = config_;
  ZERO_CHECK(T >= 1 && T <= c.block_size, "sequence length {} outside [1, {}]", T, c.block_size);
  ZERO_CHECK_EQ(tokens.size(), static_cast<size_t>(B) * T);
  ZERO_CHECK_EQ(targets.size(), static_cast<size_t>(B) * T);
  B_ = B;
  T_ = T;
  tokens_ = tokens;
  targets_ = targets;
  const int C = c.n_embd, H = c.n_head, hd = C / H, BT = B * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  access.enter(0, false);
  Matrix x(BT, C);
  {
    const float* wte = value(access, p_wte());
    const float* wpe = value(access, p_wpe());
    for (int i = 0; i < BT; ++i) {
      const int tok = tokens[static_cast<size_t>(i)];
      ZERO_CHECK(tok >= 0 && tok < c.vocab_size, "token {} outside the vocabulary", tok);
      x.row(i) = ConstRowMap(wte + static_cast<size_t>(tok) * C, C) + ConstRowMap(wpe + static_cast<size_t>(i % T) * C, C);
    }
  }
  access.leave(0, false);

  blocks_.assign(static_cast<size_t>(c.n_layer), BlockCache{});
  for (int l = 0; l < c.n_layer; ++l) {
    access.enter(1 + l, false);
    BlockCache& k = blocks_[static_cast<size_t>(l)];
    auto P = [&](int j) { return value(access, p_block(l, j)); };
    k.x_in = x;
    k.h1 = layer_norm(x, P(0), P(1), &k.ln1.xhat, &k.ln1.rstd);
    k.qkv = linear(k.h1, P(2), P(3), 3 * C);
    k.att_y.resize(BT, C);
    k.probs.assign(static_cast<size_t>(B * H), Matrix());
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < H; ++h) {
        const auto q = k.qkv.block(b * T, h * hd, T, hd);
        const auto kk = k.qkv.block(b * T, C + h * hd, T, hd);
        const auto v = k.qkv.block(b * T, 2 * C + h * hd, T, hd);
        Matrix s = (q * kk.transpose()) * scale;
        for (int i = 0; i < T; ++i) {
          for (int j = i + 1; j < T; ++j) s(i, j) = -INFINITY;
          const float mx = s.row(i).head(i + 1).maxCoeff();
          s.row(i) = (s.row(i).array() - mx).exp();
          s.row(i) /= s.row(i).sum();
        }
        k.att_y.block(b * T, h * hd, T, hd) = s * v;
        k.probs[static_cast<size_t>(b * H + h)] = std::move(s);
      }
    }
    x += linear(k.att_y, P(4), P(5), C);
    k.x_mid = x;
    k.h2 = layer_norm(x, P(6), P(7), &k.ln2.xhat, &k.ln2.rstd);
    k.fc = linear(k.h2, P(8), P(9), 4 * C);
    k.gelu = k.fc.unaryExpr([](float v) { return gelu(v); });
    x += linear(k.gelu, P(10), P(11), C);
    access.leave(1 + l, false);
  }

  access.enter(c.n_layer + 1, false);
  x_final = x;
  hf_ = layer_norm(x, value(access, p_lnf(0)), value(access, p_lnf(1)), &lnf_.xhat, &lnf_.rstd);
  access.leave(c.n_layer + 1, false);

  // The head, tied to wte: unit 0 again.
  access.enter(0, false);
  const ConstMap wte(value(access, p_wte()), c.vocab_size, C);
  probs_out_ = hf_ * wte.transpose();
  access.leave(0, false);
  double loss = 0;
  for (int i = 0; i < BT; ++i) {
    auto row = probs_out_.row(i);
    const float mx = row.maxCoeff();
    row = (row.array() - mx).exp();
    const float sum = row.sum();
    row /= sum;
    const int y = targets[static_cast<size_t>(i)];
    ZERO_CHECK(y >= 0 && y < c.vocab_size, "target {} outside the vocabulary", y);
    loss -= std::log(static_cast<double>(row(y)));
  }
  return static_cast<float>(loss / BT);
}

void Gpt::backward(float loss_scale, const Access& access) {
  const GptConfig& c = config_;
  const int B = B_, T = T_, C = c.n_embd, H = c.n_head, hd = C / H, BT = B * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto grad = [&](size_t i) { return access.grad(i); };

  // Unit 0's backward scope spans the whole backward: the head's part of dwte first, the
  // embeddings' last.
  access.enter(0, true);
  Matrix dlogits = probs_out_;
  for (int i = 0; i < BT; ++i) dlogits(i, targets_[static_cast<size_t>(i)]) -= 1.0f;
  dlogits *= loss_scale / static_cast<float>(BT);
  Map(grad(p_wte()), c.vocab_size, C).noalias() += dlogits.transpose() * hf_;
  Matrix dx = dlogits * ConstMap(value(access, p_wte()), c.vocab_size, C);

  access.enter(c.n_layer + 1, true);
  dx = layer_norm_backward(dx, lnf_.xhat, lnf_.rstd, value(access, p_lnf(0)), grad(p_lnf(0)), grad(p_lnf(1)));
  access.leave(c.n_layer + 1, true);

  for (int l = c.n_layer - 1; l >= 0; --l) {
    access.enter(1 + l, true);
    BlockCache& k = blocks_[static_cast<size_t>(l)];
    auto P = [&](int j) { return value(access, p_block(l, j)); };
    auto G = [&](int j) { return grad(p_block(l, j)); };
    // x_out = x_mid + mlp(ln_2(x_mid))
    Matrix dg = linear_backward(dx, k.gelu, P(10), G(10), G(11));
    Matrix dfc = dg.array() * k.fc.unaryExpr([](float v) { return gelu_grad(v); }).array();
    Matrix dh2 = linear_backward(dfc, k.h2, P(8), G(8), G(9));
    dx += layer_norm_backward(dh2, k.ln2.xhat, k.ln2.rstd, P(6), G(6), G(7));
    // x_mid = x_in + attn(ln_1(x_in))
    Matrix dy = linear_backward(dx, k.att_y, P(4), G(4), G(5));
    Matrix dqkv = Matrix::Zero(BT, 3 * C);
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < H; ++h) {
        const Matrix& p = k.probs[static_cast<size_t>(b * H + h)];
        const auto q = k.qkv.block(b * T, h * hd, T, hd);
        const auto kk = k.qkv.block(b * T, C + h * hd, T, hd);
        const auto v = k.qkv.block(b * T, 2 * C + h * hd, T, hd);
        const auto dyh = dy.block(b * T, h * hd, T, hd);
        const Matrix dp = dyh * v.transpose();
        dqkv.block(b * T, 2 * C + h * hd, T, hd) = p.transpose() * dyh;
        // softmax backward: ds = p * (dp - rowsum(dp * p)); masked entries have p = 0.
        const Eigen::VectorXf inner = (dp.array() * p.array()).rowwise().sum();
        Matrix ds = p.array() * (dp.colwise() - inner).array();
        ds *= scale;
        dqkv.block(b * T, h * hd, T, hd) = ds * kk;
        dqkv.block(b * T, C + h * hd, T, hd) = ds.transpose() * q;
      }
    }
    Matrix dh1 = linear_backward(dqkv, k.h1, P(2), G(2), G(3));
    dx += layer_norm_backward(dh1, k.ln1.xhat, k.ln1.rstd, P(0), G(0), G(1));
    access.leave(1 + l, true);
  }

  float* dwte = grad(p_wte());
  float* dwpe = grad(p_wpe());
  for (int i = 0; i < BT; ++i) {
    RowMap(dwte + static_cast<size_t>(tokens_[static_cast<size_t>(i)]) * C, C) += dx.row(i);
    RowMap(dwpe + static_cast<size_t>(i % T) * C, C) += dx.row(i);
  }
  access.leave(0, true);
}

std::vector<float> Gpt::next_logits(const std::vector<int>& context, const Access& access) {
  ZERO_CHECK(!context.empty(), "an empty context");
  const size_t T = std::min(context.size(), static_cast<size_t>(config_.block_size));
  const std::vector<int> window(context.end() - static_cast<std::ptrdiff_t>(T), context.end());
  // A forward with dummy targets; the last position's probabilities, as logits (log).
  forward(window, std::vector<int>(T, 0), 1, static_cast<int>(T), access);
  std::vector<float> out(static_cast<size_t>(config_.vocab_size));
  for (int v = 0; v < config_.vocab_size; ++v) out[static_cast<size_t>(v)] = std::log(probs_out_(static_cast<Eigen::Index>(T) - 1, v));
  return out;
}

}  // namespace zero::examples
