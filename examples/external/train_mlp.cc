// A training loop outside this tree: an MLP on synthetic data, trained on the ranks zerorun starts,
// with only the installed headers and libzero.so (examples/external/README.md builds it with CMake or
// with make and pkg-config).
//
//   zerorun --nproc-per-node 2 -- ./train_mlp --stage 3 --steps 30
//
// The model is two layers written with plain loops: x -> relu(x W1 + b1) -> (. W2 + b2) -> softmax
// cross-entropy against labels a fixed teacher matrix gives. Each layer is a unit: at stage 3 its
// parameters exist in full only inside its gather scopes. Rank 0 prints the global loss per step.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "comm/launch/process_group.h"
#include "zero/engine.h"

namespace {

constexpr int kInputs = 16;
constexpr int kClasses = 4;

struct Flags {
  int stage = 3;
  int steps = 30;
  int batch = 32;  // samples per step over all ranks
  int hidden = 64;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    int* target = name == "--stage" ? &f.stage : name == "--steps" ? &f.steps : name == "--batch" ? &f.batch
                : name == "--hidden" ? &f.hidden : nullptr;
    if (target == nullptr) ZERO_THROW(zero::InvalidArgument, "unknown flag '{}' (--stage, --steps, --batch, --hidden)", name);
    if (i + 1 == argc) ZERO_THROW(zero::InvalidArgument, "{} needs a value", name);
    *target = std::stoi(argv[++i]);
  }
  return f;
}

// Sample `index` of step `step`: a pure function of both, so every rank draws its own slice.
void sample(int64_t step, int64_t index, const std::vector<float>& teacher, float* x, int* label) {
  std::mt19937_64 rng(static_cast<uint64_t>(step) * 1000003ull + static_cast<uint64_t>(index) * 7919ull + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int j = 0; j < kInputs; ++j) x[j] = normal(rng);
  float best = -1e30f;
  for (int c = 0; c < kClasses; ++c) {
    float v = 0.0f;
    for (int j = 0; j < kInputs; ++j) v += x[j] * teacher[static_cast<size_t>(j * kClasses + c)];
    if (v > best) best = v, *label = c;
  }
}

std::vector<float> random_values(size_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& e : v) e = normal(rng);
  return v;
}

// out[n][m] (+)= a[n][k] * b[k][m]; with `at` a is read transposed (a[k][n]), with `bt` b (b[m][k]).
void matmul(const float* a, const float* b, float* out, int n, int k, int m, bool at, bool bt) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) {
      float s = 0.0f;
      for (int l = 0; l < k; ++l) s += (at ? a[l * n + i] : a[i * k + l]) * (bt ? b[j * k + l] : b[l * m + j]);
      out[i * m + j] += s;
    }
}

int run(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  zero::comm::ProcessGroup pg = zero::comm::init_process_group();
  zero::comm::Communicator& comm = *pg.host;
  const int rank = comm.rank(), world = comm.size();
  if (flags.batch % world != 0) {
    ZERO_THROW(zero::InvalidArgument, "--batch {} is not divisible by the world size {}", flags.batch, world);
  }
  const int n = flags.batch / world, h = flags.hidden;

  // Each rank starts from its own values: finalize() broadcasts rank 0's.
  const uint64_t seed = 100 + static_cast<uint64_t>(rank);
  std::vector<float> w1 = random_values(size_t(kInputs) * h, 1.0f / std::sqrt(float(kInputs)), seed);
  std::vector<float> b1(static_cast<size_t>(h), 0.0f);
  std::vector<float> w2 = random_values(size_t(h) * kClasses, 1.0f / std::sqrt(float(h)), seed + 7);
  std::vector<float> b2(kClasses, 0.0f);
  const std::vector<float> teacher = random_values(size_t(kInputs) * kClasses, 1.0f, 42);

  zero::EngineOptions opt;
  opt.stage = flags.stage;
  opt.optimizer.kind = zero::optim::OptimizerKind::kAdamW;
  opt.optimizer.groups = {zero::optim::Hyper{.lr = 1e-2f, .weight_decay = 0.0f}};
  opt.max_grad_norm = 1.0f;
  zero::Engine engine(comm, opt);
  auto add = [&](const char* name, std::vector<float>& v, std::vector<int64_t> shape, int unit) {
    return engine.add_param({.name = name, .shape = std::move(shape), .dtype = zero::DType::kFloat32,
                             .data = {v.data(), v.size()}, .unit = unit});
  };
  const int id_w1 = add("fc1.weight", w1, {kInputs, h}, 0), id_b1 = add("fc1.bias", b1, {h}, 0);
  const int id_w2 = add("fc2.weight", w2, {h, kClasses}, 1), id_b2 = add("fc2.bias", b2, {kClasses}, 1);
  engine.finalize();
  if (rank == 0) std::printf("external MLP: %d ranks, stage %d, batch %d\n", world, flags.stage, flags.batch);

  std::vector<float> x(size_t(n) * kInputs), hid(size_t(n) * h), logits(size_t(n) * kClasses);
  std::vector<float> d(size_t(n) * kClasses), dh(size_t(n) * h);
  std::vector<int> labels(static_cast<size_t>(n));
  for (int step = 0; step < flags.steps; ++step) {
    for (int i = 0; i < n; ++i) sample(step, int64_t(rank) * n + i, teacher, &x[size_t(i) * kInputs], &labels[size_t(i)]);
    std::fill(hid.begin(), hid.end(), 0.0f);
    std::fill(logits.begin(), logits.end(), 0.0f);
    {
      zero::UnitScope s = engine.gather(0);
      matmul(x.data(), s.param_as<float>(id_w1), hid.data(), n, kInputs, h, false, false);
      const float* b = s.param_as<float>(id_b1);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < h; ++j) hid[size_t(i * h + j)] = std::max(0.0f, hid[size_t(i * h + j)] + b[j]);
    }
    {
      zero::UnitScope s = engine.gather(1);
      matmul(hid.data(), s.param_as<float>(id_w2), logits.data(), n, h, kClasses, false, false);
      const float* b = s.param_as<float>(id_b2);
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < kClasses; ++c) logits[size_t(i * kClasses + c)] += b[c];
    }
    // Softmax cross-entropy; d = dloss/dlogits of the local mean, times the loss scale.
    double loss = 0.0;
    const float scale = engine.loss_scale() / static_cast<float>(n);
    for (int i = 0; i < n; ++i) {
      float* row = &logits[size_t(i) * kClasses];
      const float top = *std::max_element(row, row + kClasses);
      float sum = 0.0f;
      for (int c = 0; c < kClasses; ++c) sum += std::exp(row[c] - top);
      for (int c = 0; c < kClasses; ++c) {
        const float p = std::exp(row[c] - top) / sum;
        d[size_t(i * kClasses + c)] = (p - (c == labels[size_t(i)] ? 1.0f : 0.0f)) * scale;
        if (c == labels[size_t(i)]) loss -= std::log(std::max(p, 1e-30f));
      }
    }
    loss /= n;
    {
      zero::UnitScope s = engine.gather_for_backward(1);
      matmul(hid.data(), d.data(), s.grad_as<float>(id_w2), h, n, kClasses, true, false);
      float* gb = s.grad_as<float>(id_b2);
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < kClasses; ++c) gb[c] += d[size_t(i * kClasses + c)];
      std::fill(dh.begin(), dh.end(), 0.0f);
      matmul(d.data(), s.param_as<float>(id_w2), dh.data(), n, kClasses, h, false, true);
      for (size_t e = 0; e < dh.size(); ++e) dh[e] = hid[e] > 0.0f ? dh[e] : 0.0f;
    }
    {
      zero::UnitScope s = engine.gather_for_backward(0);
      matmul(x.data(), dh.data(), s.grad_as<float>(id_w1), kInputs, n, h, true, false);
      float* gb = s.grad_as<float>(id_b1);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < h; ++j) gb[j] += dh[size_t(i * h + j)];
    }
    engine.finish_backward();
    const zero::StepResult r = engine.step();
    comm.all_reduce(&loss, 1, zero::DType::kFloat64, zero::comm::ReduceOp::kAvg)->wait();
    if (rank == 0) std::printf("step %3d  loss %.6f  grad_norm %.4f\n", step + 1, loss, r.grad_norm);
  }
  comm.barrier()->wait();
  if (rank == 0) std::printf("%s", engine.memory_report().table().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const zero::Error& e) {  // the library's errors name their culprit
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
  }
  return 1;
}
