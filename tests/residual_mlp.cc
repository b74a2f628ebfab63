#include "tests/residual_mlp.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "parallel/tensor/tp_regions.h"
#include "zero/tp_placement.h"

namespace zero::testing {
namespace {

constexpr const char* kNames[] = {"w1", "b1", "w2", "b2"};

std::vector<int64_t> full_shape(const MlpShape& s, int t) {
  switch (t) {
    case 0: return {s.hidden, s.dim};
    case 1: return {s.hidden};
    case 2: return {s.dim, s.hidden};
    default: return {s.dim};
  }
}

// Megatron's split: W1 and b1 column-parallel, W2 row-parallel, b2 whole on every rank.
TpPlacement placement(int t) { return t == 2 ? TpPlacement::split(1) : t == 3 ? TpPlacement::replicated() : TpPlacement::split(0); }

}  // namespace

std::vector<float> mlp_initial(const MlpShape& s, int layer, int t) {
  const std::vector<int64_t> shape = full_shape(s, t);
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  const float fan_in = static_cast<float>(t < 2 ? s.dim : s.hidden);
  std::vector<float> v(n);
  for (size_t e = 0; e < n; ++e) {
    v[e] = std::sin(1.7f * static_cast<float>(e) + 2.3f * static_cast<float>(layer) + 0.9f * static_cast<float>(t) + 0.1f) /
           std::sqrt(fan_in);
  }
  return v;
}

std::vector<float> mlp_input(const MlpShape& s, int sample) {
  std::vector<float> x(static_cast<size_t>(s.dim));
  for (int j = 0; j < s.dim; ++j) x[static_cast<size_t>(j)] = std::sin(0.7f * static_cast<float>(sample) + 1.3f * static_cast<float>(j));
  return x;
}

std::vector<float> mlp_target(const MlpShape& s, int sample) {
  std::vector<float> y(static_cast<size_t>(s.dim));
  for (int j = 0; j < s.dim; ++j) {
    y[static_cast<size_t>(j)] = 0.5f * std::cos(0.5f * static_cast<float>(sample) - 0.9f * static_cast<float>(j));
  }
  return y;
}

// Per block of the chunk: its input, pre-activation and activation (forward), its output gradient
// and pre-activation gradient (B, for W). Row-major [samples, width].
struct ResidualMlp::Saved {
  int samples = 0;
  std::vector<std::vector<float>> x, a, h, dy, da;
  std::vector<float> y_last;  // the last stage's output minus the targets, over the samples
};

ResidualMlp::ResidualMlp(const MlpShape& shape, comm::Communicator& tp, Engine& engine, parallel::LayerRange layers)
    : shape_(shape), tp_(tp), tp_rank_(tp.rank()), tp_size_(tp.size()), engine_(engine), layers_(layers),
      h_(shape.hidden / tp.size()) {
  for (int l = layers.first; l < layers.end; ++l) {
    for (int t = 0; t < 4; ++t) {
      values_.push_back(part_of(t, mlp_initial(shape, l, t)));
      std::vector<float>& v = values_.back();
      ids_.push_back(engine.add_param({.name = fmt::format("block{}.{}", l, kNames[t]), .shape = local_shape(t),
                                       .data = {v.data(), v.size()}, .unit = l, .tp = placement(t)}));
    }
  }
}

std::vector<int64_t> ResidualMlp::local_shape(int t) const {
  return zero::local_shape(kNames[t], full_shape(shape_, t), placement(t), tp_size_);
}

std::vector<float> ResidualMlp::part_of(int t, const std::vector<float>& full) const {
  const std::vector<int64_t> local = local_shape(t);
  size_t n = 1;
  for (int64_t d : local) n *= static_cast<size_t>(d);
  std::vector<float> part(n);
  shard(full.data(), full_shape(shape_, t), placement(t), tp_rank_, tp_size_, part.data());
  return part;
}

std::vector<float> ResidualMlp::param(int layer, int t) {
  UnitScope scope = engine_.gather(layer);
  const std::span<const float> v = scope.param_span<float>(ids_[static_cast<size_t>((layer - layers_.first) * 4 + t)]);
  return {v.begin(), v.end()};
}

float ResidualMlp::forward(const parallel::StageCall& call, const parallel::StageTensor& input,
                           parallel::StageTensor& output, int sample0) {
  const int S = call.samples(), D = shape_.dim, H = h_;
  Saved& s = call.context.emplace<Saved>();
  s.samples = S;
  std::vector<float> x(static_cast<size_t>(S * D));
  if (call.first) {
    for (int r = 0; r < S; ++r) {
      const std::vector<float> in = mlp_input(shape_, sample0 + call.sample_begin + r);
      std::copy(in.begin(), in.end(), x.begin() + r * D);
    }
  } else {
    const std::span<const float> in = input.span<float>();
    x.assign(in.begin(), in.end());
  }
  for (int l = 0; l < layers_.size(); ++l) {
    UnitScope scope = engine_.gather(layers_.first + l);
    const float* w1 = scope.param_as<float>(ids_[static_cast<size_t>(4 * l)]);
    const float* b1 = scope.param_as<float>(ids_[static_cast<size_t>(4 * l + 1)]);
    const float* w2 = scope.param_as<float>(ids_[static_cast<size_t>(4 * l + 2)]);
    const float* b2 = scope.param_as<float>(ids_[static_cast<size_t>(4 * l + 3)]);
    std::vector<float> a(static_cast<size_t>(S * H)), h(a.size()), p(static_cast<size_t>(S * D), 0.0f);
    for (int r = 0; r < S; ++r) {
      for (int i = 0; i < H; ++i) {
        float acc = b1[i];
        for (int j = 0; j < D; ++j) acc += w1[i * D + j] * x[static_cast<size_t>(r * D + j)];
        a[static_cast<size_t>(r * H + i)] = acc;
        h[static_cast<size_t>(r * H + i)] = std::max(acc, 0.0f);
      }
      for (int j = 0; j < D; ++j) {
        float acc = 0;
        for (int i = 0; i < H; ++i) acc += w2[j * H + i] * h[static_cast<size_t>(r * H + i)];
        p[static_cast<size_t>(r * D + j)] = acc;
      }
    }
    parallel::ReduceFromTp::forward(tp_, p.data(), p.size());  // g: the partial outputs summed
    s.x.push_back(x);
    for (int r = 0; r < S; ++r) {
      for (int j = 0; j < D; ++j) x[static_cast<size_t>(r * D + j)] += p[static_cast<size_t>(r * D + j)] + b2[j];
    }
    s.a.push_back(std::move(a));
    s.h.push_back(std::move(h));
  }
  if (!call.last) {
    std::copy(x.begin(), x.end(), output.span<float>().begin());
    return 0;
  }
  double loss = 0;
  s.y_last.resize(x.size());
  for (int r = 0; r < S; ++r) {
    const std::vector<float> t = mlp_target(shape_, sample0 + call.sample_begin + r);
    for (int j = 0; j < D; ++j) {
      const float d = x[static_cast<size_t>(r * D + j)] - t[static_cast<size_t>(j)];
      s.y_last[static_cast<size_t>(r * D + j)] = d;
      loss += 0.5 * static_cast<double>(d) * d;
    }
  }
  return static_cast<float>(loss / S);
}

void ResidualMlp::backward(const parallel::StageCall& call, const parallel::StageTensor& grad_output,
                           parallel::StageTensor& grad_input) {
  Saved& s = std::any_cast<Saved&>(call.context);
  std::vector<float> dy;
  if (call.last) {  // d(mean loss)/dy, seeded with the loss scale
    dy = s.y_last;
    for (float& v : dy) v *= call.loss_scale / static_cast<float>(s.samples);
  } else {
    const std::span<const float> g = grad_output.span<float>();
    dy.assign(g.begin(), g.end());
  }
  s.dy.assign(static_cast<size_t>(layers_.size()), {});
  s.da.assign(static_cast<size_t>(layers_.size()), {});
  for (int l = layers_.size() - 1; l >= 0; --l) {
    UnitScope scope = engine_.gather_for_backward(layers_.first + l, call.part);
    s.dy[static_cast<size_t>(l)] = dy;
    block_input_grad(scope, s, l, dy);
    if (call.part == BackwardPart::kAll) block_weight_grad(scope, s, l);
  }
  if (!call.first) std::copy(dy.begin(), dy.end(), grad_input.span<float>().begin());
}

// dy (the block's output gradient) becomes its input gradient: the residual plus W1^T of the
// pre-activation gradient, summed over tp (f's backward).
void ResidualMlp::block_input_grad(UnitScope& scope, Saved& s, int l, std::vector<float>& dy) {
  const int S = s.samples, D = shape_.dim, H = h_;
  const float* w1 = scope.param_as<float>(ids_[static_cast<size_t>(4 * l)]);
  const float* w2 = scope.param_as<float>(ids_[static_cast<size_t>(4 * l + 2)]);
  const std::vector<float>& a = s.a[static_cast<size_t>(l)];
  std::vector<float>& da = s.da[static_cast<size_t>(l)];
  da.assign(static_cast<size_t>(S * H), 0.0f);
  std::vector<float> dx(static_cast<size_t>(S * D), 0.0f);
  for (int r = 0; r < S; ++r) {
    for (int i = 0; i < H; ++i) {
      if (a[static_cast<size_t>(r * H + i)] <= 0) continue;
      float acc = 0;
      for (int j = 0; j < D; ++j) acc += dy[static_cast<size_t>(r * D + j)] * w2[j * H + i];
      da[static_cast<size_t>(r * H + i)] = acc;
    }
    for (int j = 0; j < D; ++j) {
      float acc = 0;
      for (int i = 0; i < H; ++i) acc += da[static_cast<size_t>(r * H + i)] * w1[i * D + j];
      dx[static_cast<size_t>(r * D + j)] = acc;
    }
  }
  parallel::CopyToTp::backward(tp_, dx.data(), dx.size());  // f: the partial input gradients summed
  for (size_t e = 0; e < dy.size(); ++e) dy[e] += dx[e];
}

// The block's weight gradients from its output gradient, activations and pre-activation gradient
// (no parameter read: a weight scope does not gather them).
void ResidualMlp::block_weight_grad(UnitScope& scope, const Saved& s, int l) {
  const int S = s.samples, D = shape_.dim, H = h_;
  const std::vector<float>& x = s.x[static_cast<size_t>(l)];
  const std::vector<float>& h = s.h[static_cast<size_t>(l)];
  const std::vector<float>& dy = s.dy[static_cast<size_t>(l)];
  const std::vector<float>& da = s.da[static_cast<size_t>(l)];
  float* dw1 = scope.grad_as<float>(ids_[static_cast<size_t>(4 * l)]);
  float* db1 = scope.grad_as<float>(ids_[static_cast<size_t>(4 * l + 1)]);
  float* dw2 = scope.grad_as<float>(ids_[static_cast<size_t>(4 * l + 2)]);
  float* db2 = scope.grad_as<float>(ids_[static_cast<size_t>(4 * l + 3)]);
  for (int r = 0; r < S; ++r) {
    for (int i = 0; i < H; ++i) {
      const float d = da[static_cast<size_t>(r * H + i)];
      db1[i] += d;
      for (int j = 0; j < D; ++j) dw1[i * D + j] += d * x[static_cast<size_t>(r * D + j)];
    }
    for (int j = 0; j < D; ++j) {
      const float d = dy[static_cast<size_t>(r * D + j)];
      db2[j] += d;
      for (int i = 0; i < H; ++i) dw2[j * H + i] += d * h[static_cast<size_t>(r * H + i)];
    }
  }
}

void ResidualMlp::weight(const parallel::StageCall& call) {
  const Saved& s = std::any_cast<const Saved&>(call.context);
  for (int l = layers_.size() - 1; l >= 0; --l) {
    UnitScope scope = engine_.gather_for_backward(layers_.first + l, BackwardPart::kWeight);
    block_weight_grad(scope, s, l);
  }
}

}  // namespace zero::testing
