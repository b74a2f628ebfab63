#include "examples/mlp.h"

#include <cmath>
#include <random>

namespace zero::examples {

Mlp::Mlp(const std::vector<int>& widths, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    const int fan_in = widths[l], fan_out = widths[l + 1];
    const float bound = std::sqrt(6.0f / static_cast<float>(fan_in));
    std::uniform_real_distribution<float> w(-bound, bound), b(-0.01f, 0.01f);
    Param W{"layer" + std::to_string(l) + ".weight", {fan_in, fan_out}, {}, true};
    W.values.resize(static_cast<size_t>(fan_in) * fan_out);
    for (float& v : W.values) v = w(rng);
    Param B{"layer" + std::to_string(l) + ".bias", {fan_out}, {}, false};
    B.values.resize(static_cast<size_t>(fan_out));
    for (float& v : B.values) v = b(rng);
    params_.push_back(std::move(W));
    params_.push_back(std::move(B));
  }
}

size_t Mlp::num_params() const {
  size_t n = 0;
  for (const Param& p : params_) n += p.values.size();
  return n;
}

float Mlp::forward(const Matrix& x, const std::vector<int>& labels, const Access& access) {
  const size_t layers = params_.size() / 2;
  acts_.assign(1, x);
  pre_.clear();
  Matrix h = x;
  for (size_t l = 0; l < layers; ++l) {
    const Param& W = params_[2 * l];
    const Param& B = params_[2 * l + 1];
    access.enter(l, false);
    Eigen::Map<const Matrix> w(value(access, 2 * l), W.shape[0], W.shape[1]);
    Eigen::Map<const Vector> b(value(access, 2 * l + 1), B.shape[0]);
    Matrix z = h * w;
    z.rowwise() += b;
    access.leave(l, false);
    if (l + 1 < layers) {
      pre_.push_back(z);
      h = z.cwiseMax(0.0f);
      acts_.push_back(h);
    } else {
      h = z;
    }
  }
  // Softmax cross-entropy, numerically stable.
  probs_ = h;
  float loss = 0.0f;
  for (Eigen::Index i = 0; i < probs_.rows(); ++i) {
    const float m = probs_.row(i).maxCoeff();
    probs_.row(i) = (probs_.row(i).array() - m).exp();
    const float s = probs_.row(i).sum();
    probs_.row(i) /= s;
    loss -= std::log(std::max(probs_(i, labels[static_cast<size_t>(i)]), 1e-30f));
  }
  labels_ = labels;
  return loss / static_cast<float>(probs_.rows());
}

void Mlp::backward(float loss_scale, const std::function<float*(size_t)>& grad,
                   const std::function<void(size_t)>& ready, const Access& access) {
  const size_t layers = params_.size() / 2;
  Matrix d = probs_;
  for (Eigen::Index i = 0; i < d.rows(); ++i) d(i, labels_[static_cast<size_t>(i)]) -= 1.0f;
  d *= loss_scale / static_cast<float>(d.rows());
  for (size_t l = layers; l-- > 0;) {
    const Param& W = params_[2 * l];
    const Matrix& in = acts_[l];
    access.enter(l, true);
    MatrixMap gw(grad(2 * l), W.shape[0], W.shape[1]);
    gw.noalias() += in.transpose() * d;
    ready(2 * l);
    VectorMap gb(grad(2 * l + 1), W.shape[1]);
    gb += d.colwise().sum();
    ready(2 * l + 1);
    if (l == 0) {
      access.leave(l, true);
      break;
    }
    Eigen::Map<const Matrix> w(value(access, 2 * l), W.shape[0], W.shape[1]);
    Matrix dh = d * w.transpose();
    access.leave(l, true);
    d = dh.cwiseProduct((pre_[l - 1].array() > 0.0f).cast<float>().matrix());
  }
}

SyntheticData::SyntheticData(int inputs, int classes, uint64_t seed)
    : inputs_(inputs), seed_(seed), teacher_(inputs, classes) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (Eigen::Index i = 0; i < teacher_.size(); ++i) teacher_.data()[i] = n(rng);
}

void SyntheticData::batch(int64_t step, int64_t first, int count, Matrix* x,
                          std::vector<int>* labels) const {
  x->resize(count, inputs_);
  labels->resize(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    // One generator per sample, so a sample does not depend on which rank draws it.
    std::mt19937_64 rng(seed_ + 1000003ull * static_cast<uint64_t>(step) +
                        static_cast<uint64_t>(first + i) * 7919ull);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (int j = 0; j < inputs_; ++j) (*x)(i, j) = n(rng);
    Eigen::Index label;
    (x->row(i) * teacher_).maxCoeff(&label);
    (*labels)[static_cast<size_t>(i)] = static_cast<int>(label);
  }
}

}  // namespace zero::examples
