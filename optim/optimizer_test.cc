// Optimizer behaviour beyond the PyTorch files: Lion, SGD with dampening and plain SGD, Adagrad with
// lr_decay/weight decay/initial accumulator, several groups and segments, fp16/bf16 gradients, the
// grad scale, the 16-bit copy-out (equal to round-to-nearest-even of the master, bit for bit), bf16
// state, checkpoint access by parameter range (including resharding), and every validation error.
//
// The reference below is a plain scalar transcription of PyTorch's single-tensor code (and of
// lion-pytorch for Lion), with std::fma exactly where PyTorch's kernels fuse (see step_kernels.inc);
// the PyTorch data test pins that model down for AdamW, Adam, SGD and Adagrad.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/dtype.h"
#include "base/error.h"
#include "memory/buffer.h"
#include "memory/tracker.h"
#include "optim/custom_optimizer.h"
#include "optim/optimizer.h"

namespace zero::optim {
namespace {

float bf16_round(float x) { return bf16_bits_to_fp32(fp32_to_bf16_bits(x)); }

// PyTorch rounds Python-double scalars to float where they meet a tensor.
struct Ref {
  OptimizerKind kind;
  std::vector<Hyper> groups;
  bool bf16_state = false;
  std::vector<float> s0, s1;
  std::vector<char> sgd_started;
  int64_t t = 0;

  Ref(OptimizerKind k, std::vector<Hyper> g, size_t n, bool bf16 = false)
      : kind(k), groups(std::move(g)), bf16_state(bf16), s0(n, 0.f), s1(n, 0.f),
        sgd_started(groups.size(), 0) {}

  float st(float x) const { return bf16_state ? bf16_round(x) : x; }

  // One step over every element with a group (group_of[i] >= 0).
  void step(std::vector<float>& p, const std::vector<float>& grad, float scale,
            const std::vector<int>& group_of) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      if (group_of[i] < 0) continue;
      const Hyper& h = groups[static_cast<size_t>(group_of[i])];
      float g = grad[i] * scale;
      const double dlr = decimal(h.lr), dwd = decimal(h.weight_decay);
      const double b1 = decimal(h.beta1), b2 = decimal(h.beta2);
      switch (kind) {
        case OptimizerKind::kAdamW:
        case OptimizerKind::kAdam: {
          if (kind == OptimizerKind::kAdamW) p[i] = p[i] * static_cast<float>(1.0 - dlr * dwd);
          if (kind == OptimizerKind::kAdam && h.weight_decay != 0.f) g = std::fma(p[i], h.weight_decay, g);
          const float m = std::fma(g, static_cast<float>(1.0 - b1), s0[i] * h.beta1);
          const float v = std::fma(static_cast<float>(1.0 - b2) * g, g, s1[i] * h.beta2);
          s0[i] = st(m);
          s1[i] = st(v);
          const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
          const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
          const float denom = std::sqrt(v) / static_cast<float>(std::sqrt(bc2)) + h.eps;
          p[i] = p[i] + (static_cast<float>(-(dlr / bc1)) * m) / denom;
          break;
        }
        case OptimizerKind::kSgd: {
          if (h.weight_decay != 0.f) g = std::fma(p[i], h.weight_decay, g);
          if (h.momentum != 0.f) {
            const bool first = !sgd_started[static_cast<size_t>(group_of[i])];
            const float buf = first ? g
                                    : std::fma(g, static_cast<float>(1.0 - decimal(h.dampening)),
                                               s0[i] * h.momentum);
            s0[i] = st(buf);
            g = h.nesterov ? std::fma(buf, h.momentum, g) : buf;
          }
          p[i] = std::fma(g, static_cast<float>(-dlr), p[i]);
          break;
        }
        case OptimizerKind::kAdagrad: {
          if (h.weight_decay != 0.f) g = std::fma(p[i], h.weight_decay, g);
          const float sum = std::fma(g, g, s0[i]);
          s0[i] = st(sum);
          const double clr = dlr / (1.0 + static_cast<double>(t - 1) * decimal(h.lr_decay));
          p[i] = p[i] + (static_cast<float>(-clr) * g) / (std::sqrt(sum) + h.eps);
          break;
        }
        case OptimizerKind::kLion: {
          const float c = std::fma(g, static_cast<float>(1.0 - b1), s0[i] * h.beta1);
          const float sign = static_cast<float>(0.f < c) - static_cast<float>(c < 0.f);
          p[i] = p[i] * static_cast<float>(1.0 - dlr * dwd);
          p[i] = std::fma(sign, static_cast<float>(-dlr), p[i]);
          s0[i] = st(std::fma(g, static_cast<float>(1.0 - b2), s0[i] * h.beta2));
          break;
        }
        case OptimizerKind::kMuon:       // not elementwise: zero/muon_engine_test.cc
        case OptimizerKind::kAdamW8bit:  // zero/adamw8bit_engine_test.cc
        case OptimizerKind::kAdafactor:  // zero/adafactor_engine_test.cc
          FAIL("no elementwise reference for Muon");
          break;
      }
    }
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      if (groups[gi].momentum != 0.f) sgd_started[gi] = 1;
    }
  }

  // The decimal a float hyperparameter stands for (as the optimizer reads it).
  static double decimal(float f) { return std::stod(shortest(f)); }
  static std::string shortest(float f) {
    for (int digits = 1; digits <= 9; ++digits) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
      if (std::strtof(buf, nullptr) == f) return buf;
    }
    return std::to_string(f);
  }
};

std::vector<float> random_vector(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A shard of 1003 elements: param "a" [0, 400) at shard [3, 403) in group 0, padding [403, 410),
// param "b" [0, 590) at shard [410, 1000) in group 1, padding [0, 3) and [1000, 1003).
struct TwoParamLayout {
  size_t numel = 1003;
  std::vector<Segment> segments{Segment{3, 403, 0, "a", 0}, Segment{410, 1000, 1, "b", 0}};
  std::vector<int> group_of;
  TwoParamLayout() : group_of(1003, -1) {
    for (size_t i = 3; i < 403; ++i) group_of[i] = 0;
    for (size_t i = 410; i < 1000; ++i) group_of[i] = 1;
  }
};

std::vector<Hyper> two_groups(OptimizerKind kind) {
  Hyper a, b;
  switch (kind) {
    case OptimizerKind::kAdamW:
      a = Hyper{.lr = 2e-3f, .weight_decay = 0.1f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f};
      b = Hyper{.lr = 1e-3f, .weight_decay = 0.f};
      break;
    case OptimizerKind::kAdam:
      a = Hyper{.lr = 1e-2f, .weight_decay = 0.05f, .beta1 = 0.9f, .beta2 = 0.95f};
      b = Hyper{.lr = 3e-3f};
      break;
    case OptimizerKind::kSgd:
      a = Hyper{.lr = 0.05f, .weight_decay = 1e-3f, .momentum = 0.9f, .dampening = 0.1f};
      b = Hyper{.lr = 0.1f, .momentum = 0.f};  // plain SGD: no buffer
      break;
    case OptimizerKind::kAdagrad:
      a = Hyper{.lr = 0.05f, .weight_decay = 0.01f, .eps = 1e-10f, .lr_decay = 0.1f,
                .initial_accumulator_value = 0.25f};
      b = Hyper{.lr = 0.01f, .eps = 1e-10f};
      break;
    case OptimizerKind::kLion:
      a = Hyper{.lr = 1e-4f, .weight_decay = 1.0f, .beta1 = 0.9f, .beta2 = 0.99f};
      b = Hyper{.lr = 3e-4f, .weight_decay = 0.f, .beta1 = 0.95f, .beta2 = 0.98f};
      break;
    case OptimizerKind::kMuon:       // not elementwise: zero/muon_engine_test.cc
    case OptimizerKind::kAdamW8bit:  // zero/adamw8bit_engine_test.cc
    case OptimizerKind::kAdafactor:  // zero/adafactor_engine_test.cc
      break;
  }
  return {a, b};
}

const OptimizerKind kAllKinds[] = {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd,
                                   OptimizerKind::kAdagrad, OptimizerKind::kLion};

// Runs `steps` steps of `kind` on the two-parameter layout with the given precisions; returns the
// master after each step (whole shard). Checks the copy-out against RNE(master) each step.
struct KindRun {
  std::vector<std::vector<float>> masters;  // whole shard after each step
  std::vector<std::vector<float>> states;   // each state array after the last step, as fp32
  bool operator==(const KindRun&) const = default;
};

KindRun run_kind(OptimizerKind kind, SimdPath path, int threads, DType grad_dtype, DType state_dtype,
                 DType out_dtype, bool with_out, float grad_scale, int steps = 4) {
  const TwoParamLayout l;
  OptimizerOptions o;
  o.kind = kind;
  o.groups = two_groups(kind);
  o.num_threads = threads;
  o.simd_path = path;
  o.state_dtype = state_dtype;
  Optimizer opt(o, l.numel, l.segments);
  std::vector<float> master = random_vector(l.numel, 1, 1.0f);
  KindRun result;
  for (int s = 0; s < steps; ++s) {
    // Gradients exactly representable in fp16 and bf16 (and scaled by a power of two), so every
    // grad_dtype carries the same values.
    std::vector<float> gf = random_vector(l.numel, 100 + static_cast<uint32_t>(s), 0.5f);
    for (float& g : gf) g = bf16_round(g) / grad_scale;
    for (float& g : gf) g = fp16_bits_to_fp32(fp32_to_fp16_bits(g));
    std::vector<uint16_t> g16(l.numel);
    for (size_t i = 0; i < l.numel; ++i) {
      g16[i] = grad_dtype == DType::kFloat16 ? fp32_to_fp16_bits(gf[i]) : fp32_to_bf16_bits(gf[i]);
    }
    std::vector<uint16_t> out16(l.numel, 0);
    std::vector<float> out32(l.numel, 0.f);
    StepInput in;
    in.master = master.data();
    in.grad = grad_dtype == DType::kFloat32 ? static_cast<const void*>(gf.data()) : g16.data();
    in.grad_dtype = grad_dtype;
    in.grad_scale = grad_scale;
    if (with_out) {
      in.model_out = out_dtype == DType::kFloat32 ? static_cast<void*>(out32.data()) : out16.data();
      in.model_dtype = out_dtype;
    }
    opt.step(in);
    if (with_out) {
      for (size_t i = 0; i < l.numel; ++i) {
        if (l.group_of[i] < 0) {
          REQUIRE(out16[i] == 0);
          REQUIRE(out32[i] == 0.f);
          continue;
        }
        if (out_dtype == DType::kFloat32) {
          REQUIRE(std::memcmp(&out32[i], &master[i], 4) == 0);
        } else if (out_dtype == DType::kFloat16) {
          REQUIRE(out16[i] == fp32_to_fp16_bits(master[i]));
        } else {
          REQUIRE(out16[i] == fp32_to_bf16_bits(master[i]));
        }
      }
    }
    result.masters.push_back(master);
  }
  for (const std::string& name : opt.state_names()) {
    std::vector<float> st(l.numel);
    const void* data = opt.state_data(name);
    for (size_t i = 0; i < l.numel; ++i) {
      st[i] = state_dtype == DType::kFloat32
                  ? static_cast<const float*>(data)[i]
                  : bf16_bits_to_fp32(static_cast<const uint16_t*>(data)[i]);
    }
    result.states.push_back(std::move(st));
  }
  return result;
}

TEST_CASE("every optimizer with two groups matches the scalar PyTorch transcription bit for bit") {
  for (OptimizerKind kind : kAllKinds) {
    for (DType state : {DType::kFloat32, DType::kBFloat16}) {
      const TwoParamLayout l;
      Ref ref(kind, two_groups(kind), l.numel, state == DType::kBFloat16);
      if (kind == OptimizerKind::kAdagrad) {
        for (size_t i = 0; i < l.numel; ++i) {
          if (l.group_of[i] >= 0) {
            ref.s0[i] = ref.st(ref.groups[static_cast<size_t>(l.group_of[i])].initial_accumulator_value);
          }
        }
      }
      std::vector<float> p = random_vector(l.numel, 1, 1.0f);
      std::vector<std::vector<float>> expected;
      for (int s = 0; s < 4; ++s) {
        std::vector<float> gf = random_vector(l.numel, 100 + static_cast<uint32_t>(s), 0.5f);
        for (float& g : gf) g = fp16_bits_to_fp32(fp32_to_fp16_bits(bf16_round(g)));
        ref.step(p, gf, 1.0f, l.group_of);
        expected.push_back(p);
      }
      for (SimdPath path : supported_simd_paths()) {
        for (int threads : {1, 2}) {
          CAPTURE(optimizer_name(kind));
          CAPTURE(dtype_name(state));
          CAPTURE(simd_path_name(path));
          CAPTURE(threads);
          const KindRun got = run_kind(kind, path, threads, DType::kFloat32, state,
                                       DType::kBFloat16, /*with_out=*/true, 1.0f);
          for (size_t s = 0; s < got.masters.size(); ++s) {
            CAPTURE(s);
            for (size_t i = 0; i < l.numel; ++i) {
              if (std::memcmp(&got.masters[s][i], &expected[s][i], 4) != 0) {
                FAIL("element " << i << ": got " << got.masters[s][i] << ", reference "
                                << expected[s][i]);
              }
            }
          }
          // The state too (Lion's parameters hardly depend on the momentum's last bits).
          const std::vector<float>* ref_states[] = {&ref.s0, &ref.s1};
          REQUIRE(got.states.size() == (kind == OptimizerKind::kAdamW || kind == OptimizerKind::kAdam ? 2u : 1u));
          for (size_t k = 0; k < got.states.size(); ++k) {
            for (size_t i = 0; i < l.numel; ++i) {
              if (std::memcmp(&got.states[k][i], &(*ref_states[k])[i], 4) != 0) {
                FAIL("state " << k << " element " << i << ": got " << got.states[k][i]
                              << ", reference " << (*ref_states[k])[i]);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("fp16 and bf16 gradients, grad_scale and every copy-out dtype give the fp32 results") {
  for (OptimizerKind kind : kAllKinds) {
    const auto base = run_kind(kind, SimdPath::kScalar, 1, DType::kFloat32, DType::kFloat32,
                               DType::kBFloat16, false, 1.0f);
    for (SimdPath path : supported_simd_paths()) {
      CAPTURE(optimizer_name(kind));
      CAPTURE(simd_path_name(path));
      for (DType gd : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
        CAPTURE(dtype_name(gd));
        CHECK(run_kind(kind, path, 2, gd, DType::kFloat32, DType::kBFloat16, false, 1.0f) == base);
      }
      // Gradients stored 1024x larger (as under a loss scale) and unscaled in the step.
      CHECK(run_kind(kind, path, 1, DType::kFloat16, DType::kFloat32, DType::kBFloat16, false,
                     1.0f / 1024) ==
            run_kind(kind, path, 1, DType::kFloat32, DType::kFloat32, DType::kBFloat16, false,
                     1.0f / 1024));
      for (DType od : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
        CAPTURE(dtype_name(od));
        CHECK(run_kind(kind, path, 2, DType::kBFloat16, DType::kFloat32, od, true, 1.0f) == base);
      }
    }
  }
}

TEST_CASE("copy-out of special values is the round-to-nearest-even of the master") {
  // SGD with lr = 0 and zero gradients leaves the master unchanged (p + 0 * -0), so the copy-out
  // converts exactly these values: ties, fp16 overflow boundary, subnormals, signed zeros, Inf.
  std::vector<float> values = {0.f, -0.f, 1.f, -1.f, 65504.f, 65519.f, 65520.f, -65520.f, 1e-8f,
                               6e-8f, 5.96e-8f, 2.98e-8f, 1e-40f, -1e-40f, 3.0e38f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               bits_float(0x3f808000u), bits_float(0x3f818000u),  // bf16 ties
                               bits_float(0x3f801000u), bits_float(0x3f803000u),  // fp16 ties
                               bits_float(0x7f7fffffu), bits_float(0x00000001u)};
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) values.push_back(bits_float(static_cast<uint32_t>(rng()) & 0xff7fffffu));
  for (float& v : values) {
    if (std::isnan(v)) v = 1.f;
  }
  const size_t n = values.size();
  for (SimdPath path : supported_simd_paths()) {
    for (DType od : {DType::kFloat16, DType::kBFloat16}) {
      OptimizerOptions o;
      o.kind = OptimizerKind::kSgd;
      o.groups = {Hyper{.lr = 0.f}};
      o.simd_path = path;
      Optimizer opt(o, n, {Segment{0, n, 0, "w", 0}});
      std::vector<float> master = values;
      std::vector<float> grad(n, 0.f);
      std::vector<uint16_t> out(n, 0);
      opt.step(StepInput{.master = master.data(), .grad = grad.data(), .model_out = out.data(),
                         .model_dtype = od});
      for (size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        CAPTURE(values[i]);
        REQUIRE(std::memcmp(&master[i], &values[i], 4) == 0);
        REQUIRE(out[i] == (od == DType::kFloat16 ? fp32_to_fp16_bits(values[i])
                                                 : fp32_to_bf16_bits(values[i])));
      }
    }
  }
}

TEST_CASE("large ranges (streaming copy-out stores) give the same bits as small ones") {
  // 540K elements: the range's copy-out is over 1 MiB even in 16 bits, so the vector paths write it
  // with streaming stores when it is aligned; an output offset by one element takes normal stores.
  const size_t n = 540000;
  using memory::Category;
  const std::vector<float> init = random_vector(n, 11, 1.f);
  const std::vector<std::vector<float>> grads = {random_vector(n, 20, 1.f), random_vector(n, 21, 1.f)};
  for (DType od : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    std::vector<float> reference;  // master after 2 steps, scalar path
    for (SimdPath path : supported_simd_paths()) {
      for (size_t out_offset : {size_t{0}, size_t{1}}) {
        CAPTURE(dtype_name(od));
        CAPTURE(simd_path_name(path));
        CAPTURE(out_offset);
        OptimizerOptions o;
        o.kind = OptimizerKind::kAdamW;
        o.groups = {Hyper{.lr = 1e-2f, .weight_decay = 0.1f}};
        o.simd_path = path;
        o.num_threads = 1;
        Optimizer opt(o, n, {Segment{0, n, 0, "w", 0}});
        memory::Buffer master_buf = memory::allocate_host(n * 4, Category::kOther);
        memory::Buffer out_buf = memory::allocate_host((n + 1) * 4, Category::kOther);
        float* master = master_buf.as<float>();
        std::copy(init.begin(), init.end(), master);
        char* out = static_cast<char*>(out_buf.data()) + out_offset * dtype_size(od);
        for (const std::vector<float>& g : grads) {
          opt.step(StepInput{.master = master, .grad = g.data(), .model_out = out, .model_dtype = od});
        }
        for (size_t i = 0; i < n; ++i) {
          if (od == DType::kFloat32) {
            REQUIRE(std::memcmp(out + 4 * i, &master[i], 4) == 0);
          } else {
            uint16_t bits;
            std::memcpy(&bits, out + 2 * i, 2);
            REQUIRE(bits == (od == DType::kFloat16 ? fp32_to_fp16_bits(master[i])
                                                   : fp32_to_bf16_bits(master[i])));
          }
        }
        if (reference.empty()) {
          reference.assign(master, master + n);
        } else {
          REQUIRE(std::memcmp(reference.data(), master, n * 4) == 0);
        }
      }
    }
  }
}

TEST_CASE("state by parameter range: read, write, bf16 rounding, resharded resume") {
  const TwoParamLayout l;
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  o.groups = two_groups(o.kind);
  Optimizer opt(o, l.numel, l.segments);
  CHECK(opt.state_names() == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  std::vector<float> master = random_vector(l.numel, 1, 1.f);
  std::vector<std::vector<float>> grads;
  for (int s = 0; s < 6; ++s) grads.push_back(random_vector(l.numel, 50 + static_cast<uint32_t>(s), 1.f));
  for (int s = 0; s < 3; ++s) opt.step(StepInput{.master = master.data(), .grad = grads[s].data()});

  // Read "b" elements [100, 700): only [100, 590) exist in this shard.
  std::vector<float> out(600, -1.f);
  CHECK(opt.read_state("exp_avg", "b", 100, 700, out.data()) == 490);
  const float* m = static_cast<const float*>(opt.state_data("exp_avg"));
  for (size_t k = 0; k < 490; ++k) REQUIRE(out[k] == m[410 + 100 + k]);
  for (size_t k = 490; k < 600; ++k) REQUIRE(out[k] == -1.f);
  CHECK(opt.read_state("exp_avg", "no_such_param", 0, 10, out.data()) == 0);
  CHECK(opt.read_state("exp_avg", "a", 5, 5, nullptr) == 0);

  // Resume on a different sharding: "b" first, then "a" split in two segments, other groups order.
  std::vector<Segment> segs2 = {Segment{0, 590, 1, "b", 0}, Segment{600, 800, 0, "a", 200},
                                Segment{800, 1000, 0, "a", 0}};
  Optimizer opt2(o, 1000, segs2);
  opt2.set_step_count(opt.step_count());
  std::vector<float> master2(1000, 0.f);
  const auto move_param = [&](const std::vector<float>& src, std::vector<float>& dst, bool forward) {
    // a[k] at shard1 3+k / shard2 (k < 200 ? 800+k : 600+k-200); b[k] at 410+k / k.
    for (size_t k = 0; k < 400; ++k) {
      const size_t i1 = 3 + k, i2 = k < 200 ? 800 + k : 600 + (k - 200);
      if (forward) dst[i2] = src[i1]; else dst[i1] = src[i2];
    }
    for (size_t k = 0; k < 590; ++k) {
      if (forward) dst[k] = src[410 + k]; else dst[410 + k] = src[k];
    }
  };
  move_param(master, master2, true);
  for (const std::string& name : opt.state_names()) {
    for (const char* param : {"a", "b"}) {
      const size_t len = param[0] == 'a' ? 400 : 590;
      std::vector<float> buf(len);
      REQUIRE(opt.read_state(name, param, 0, len, buf.data()) == len);
      REQUIRE(opt2.write_state(name, param, 0, len, buf.data()) == len);
    }
  }
  for (int s = 3; s < 6; ++s) {
    opt.step(StepInput{.master = master.data(), .grad = grads[s].data()});
    std::vector<float> g2(1000, 0.f);
    move_param(grads[s], g2, true);
    opt2.step(StepInput{.master = master2.data(), .grad = g2.data()});
  }
  std::vector<float> back(l.numel, 0.f);
  move_param(master2, back, false);
  for (size_t i = 0; i < l.numel; ++i) {
    if (l.group_of[i] >= 0) REQUIRE(std::memcmp(&back[i], &master[i], 4) == 0);
  }

  // bf16 state: written rounded to nearest even, read back exactly.
  OptimizerOptions ob = o;
  ob.state_dtype = DType::kBFloat16;
  Optimizer opt3(ob, l.numel, l.segments);
  CHECK(opt3.state_dtype() == DType::kBFloat16);
  const std::vector<float> values = random_vector(400, 9, 1.f);
  CHECK(opt3.write_state("exp_avg_sq", "a", 0, 400, values.data()) == 400);
  std::vector<float> read(400);
  CHECK(opt3.read_state("exp_avg_sq", "a", 0, 400, read.data()) == 400);
  for (size_t k = 0; k < 400; ++k) REQUIRE(read[k] == bf16_round(values[k]));
  const uint16_t* raw = static_cast<const uint16_t*>(opt3.state_data("exp_avg_sq"));
  CHECK(raw[3] == fp32_to_bf16_bits(values[0]));
}

TEST_CASE("SGD momentum buffer starts as d_p; set_step_count restores an existing buffer") {
  Hyper h{.lr = 0.1f, .momentum = 0.9f, .dampening = 0.5f};
  OptimizerOptions o;
  o.kind = OptimizerKind::kSgd;
  o.groups = {h};
  Optimizer opt(o, 4, {Segment{0, 4, 0, "w", 0}});
  std::vector<float> p = {1.f, 2.f, 3.f, 4.f}, g = {1.f, -1.f, 0.5f, 2.f};
  opt.step(StepInput{.master = p.data(), .grad = g.data()});
  const float* buf = static_cast<const float*>(opt.state_data("momentum_buffer"));
  for (size_t i = 0; i < 4; ++i) CHECK(buf[i] == g[i]);  // no dampening on the first step
  opt.step(StepInput{.master = p.data(), .grad = g.data()});
  for (size_t i = 0; i < 4; ++i) CHECK(buf[i] == std::fma(g[i], 0.5f, g[i] * 0.9f));

  // A fresh optimizer resumed at step 2 with that buffer continues the same way.
  Optimizer resumed(o, 4, {Segment{0, 4, 0, "w", 0}});
  std::vector<float> saved(buf, buf + 4);
  resumed.write_state("momentum_buffer", "w", 0, 4, saved.data());
  resumed.set_step_count(2);
  std::vector<float> p2 = p;
  opt.step(StepInput{.master = p.data(), .grad = g.data()});
  resumed.step(StepInput{.master = p2.data(), .grad = g.data()});
  CHECK(p == p2);
}

TEST_CASE("moves, many threads on few elements, empty shard") {
  OptimizerOptions o;
  o.num_threads = 8;
  Optimizer a(o, 5, {Segment{0, 5, 0, "w", 0}});
  Optimizer b = std::move(a);
  std::vector<float> p(5, 1.f), g(5, 1.f);
  b.step(StepInput{.master = p.data(), .grad = g.data()});
  b.step(StepInput{.master = p.data(), .grad = g.data()});
  CHECK(b.step_count() == 2);
  CHECK(b.num_threads() == 8);
  for (float x : p) CHECK(x < 1.f);

  Optimizer empty(OptimizerOptions{}, 0, {});
  empty.step(StepInput{});
  CHECK(empty.step_count() == 1);
}

TEST_CASE("state memory is reported to the memory tracker as optimizer state") {
  auto& tracker = memory::MemoryTracker::global();
  const uint64_t before = tracker.usage(memory::Category::kOptimizerState).current;
  {
    OptimizerOptions o;  // AdamW: two fp32 arrays
    Optimizer opt(o, 1000, {Segment{0, 1000, 0, "w", 0}});
    CHECK(tracker.usage(memory::Category::kOptimizerState).current == before + 8000);
    o.state_dtype = DType::kBFloat16;
    Optimizer half(o, 1000, {Segment{0, 1000, 0, "w", 0}});
    CHECK(tracker.usage(memory::Category::kOptimizerState).current == before + 12000);
  }
  CHECK(tracker.usage(memory::Category::kOptimizerState).current == before);
}

// ---- validation ----

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument thrown)";
}

void expect_error(const std::function<void()>& fn, const std::string& needle) {
  const std::string msg = error_of(fn);
  CAPTURE(msg);
  CHECK(msg.find(needle) != std::string::npos);
}

OptimizerOptions with_group1(OptimizerKind kind, const std::function<void(Hyper&)>& edit) {
  OptimizerOptions o;
  o.kind = kind;
  o.groups = {Hyper{}, Hyper{}};
  edit(o.groups[1]);
  return o;
}

TEST_CASE("invalid hyperparameters name the field and the group") {
  const std::vector<Segment> segs = {Segment{0, 8, 0, "w", 0}};
  const auto make = [&](OptimizerKind kind, const std::function<void(Hyper&)>& edit) {
    return [=] { Optimizer opt(with_group1(kind, edit), 8, segs); };
  };
  using K = OptimizerKind;
  expect_error(make(K::kAdamW, [](Hyper& h) { h.lr = -1e-3f; }), "groups[1].lr must be >= 0");
  expect_error(make(K::kAdamW, [](Hyper& h) { h.lr = NAN; }), "groups[1].lr must be finite");
  expect_error(make(K::kAdam, [](Hyper& h) { h.beta1 = 1.0f; }), "groups[1].beta1 must be in [0, 1)");
  expect_error(make(K::kAdam, [](Hyper& h) { h.beta2 = -0.1f; }), "groups[1].beta2 must be in [0, 1)");
  expect_error(make(K::kLion, [](Hyper& h) { h.beta2 = 1.5f; }), "groups[1].beta2");
  expect_error(make(K::kAdamW, [](Hyper& h) { h.eps = 0.f; }), "groups[1].eps must be > 0");
  expect_error(make(K::kAdagrad, [](Hyper& h) { h.eps = -1e-10f; }), "groups[1].eps must be > 0");
  expect_error(make(K::kAdamW, [](Hyper& h) { h.weight_decay = -0.1f; }), "groups[1].weight_decay");
  expect_error(make(K::kSgd, [](Hyper& h) { h.momentum = -0.9f; }), "groups[1].momentum must be >= 0");
  expect_error(make(K::kSgd, [](Hyper& h) { h.dampening = 2.f; }), "groups[1].dampening");
  expect_error(make(K::kSgd, [](Hyper& h) { h.nesterov = true; }), "groups[1].nesterov requires");
  expect_error(make(K::kSgd, [](Hyper& h) {
                 h.nesterov = true;
                 h.momentum = 0.9f;
                 h.dampening = 0.1f;
               }),
               "groups[1].nesterov requires");
  expect_error(make(K::kAdagrad, [](Hyper& h) { h.lr_decay = -1.f; }), "groups[1].lr_decay");
  expect_error(make(K::kAdagrad, [](Hyper& h) { h.initial_accumulator_value = -1.f; }),
               "groups[1].initial_accumulator_value");
  // Fields an optimizer does not use are not checked.
  CHECK(error_of(make(K::kSgd, [](Hyper& h) { h.beta1 = 5.f; })) == "(no InvalidArgument thrown)");
  CHECK(error_of(make(K::kAdamW, [](Hyper& h) { h.momentum = -1.f; })) ==
        "(no InvalidArgument thrown)");
}

TEST_CASE("invalid options, segments and step inputs name the field") {
  OptimizerOptions o;
  const std::vector<Segment> one = {Segment{0, 8, 0, "w", 0}};
  expect_error([&] { Optimizer(OptimizerOptions{.groups = {}}, 8, one); }, "groups must not be empty");
  expect_error([&] { Optimizer(OptimizerOptions{.state_dtype = DType::kFloat16}, 8, one); },
               "state_dtype must be fp32 or bf16");
  expect_error([&] { Optimizer(OptimizerOptions{.num_threads = 0}, 8, one); }, "num_threads");
  expect_error([&] { Optimizer(o, 8, {Segment{0, 9, 0, "w", 0}}); },
               "segments[0].end (9) > shard_numel (8)");
  expect_error([&] { Optimizer(o, 8, {Segment{5, 3, 0, "w", 0}}); }, "segments[0].begin (5) > ");
  expect_error([&] { Optimizer(o, 8, {Segment{0, 8, 1, "w", 0}}); }, "segments[0].group (1)");
  expect_error([&] { Optimizer(o, 8, {Segment{0, 8, -1, "w", 0}}); }, "segments[0].group (-1)");
  expect_error([&] { Optimizer(o, 8, {Segment{0, 5, 0, "w", 0}, Segment{4, 8, 0, "v", 0}}); },
               "overlaps");
  expect_error([&] { Optimizer(o, 10, {Segment{0, 10, 0, "w", 0}, Segment{2, 3, 0, "v", 0}}); },
               "overlaps");
  expect_error([&] { Optimizer(o, 8, {Segment{0, 4, 0, "w", 0}, Segment{4, 8, 0, "w", 2}}); },
               "both hold elements [2, 4) of parameter 'w'");

  Optimizer opt(o, 8, one);
  std::vector<float> p(8, 1.f), g(8, 1.f);
  std::vector<uint16_t> out(8);
  expect_error([&] { opt.step(StepInput{.master = p.data(), .grad = g.data(), .grad_numel = 7}); },
               "StepInput.grad_numel (7) != shard_numel (8)");
  expect_error([&] { opt.step(StepInput{.master = p.data(), .grad = g.data(), .master_numel = 9}); },
               "StepInput.master_numel (9) != shard_numel (8)");
  expect_error([&] {
    opt.step(StepInput{.master = p.data(), .grad = g.data(), .model_out = out.data(), .model_numel = 4});
  }, "StepInput.model_numel (4) != shard_numel (8)");
  expect_error([&] { opt.step(StepInput{.master = nullptr, .grad = g.data()}); }, "StepInput.master is null");
  expect_error([&] { opt.step(StepInput{.master = p.data(), .grad = nullptr}); }, "StepInput.grad is null");
  expect_error([&] {
    opt.step(StepInput{.master = p.data(), .grad = g.data(), .grad_dtype = DType::kFloat64});
  }, "StepInput.grad_dtype");
  expect_error([&] {
    opt.step(StepInput{.master = p.data(), .grad = g.data(), .model_out = out.data(),
                       .model_dtype = DType::kInt32});
  }, "StepInput.model_dtype");
  expect_error([&] { opt.step(StepInput{.master = p.data(), .grad = g.data(), .grad_scale = INFINITY}); },
               "StepInput.grad_scale");
  CHECK(opt.step_count() == 0);

  // A group made invalid through group() is caught at the next step, before anything changes.
  opt.group(0).lr = -1.f;
  expect_error([&] { opt.step(StepInput{.master = p.data(), .grad = g.data()}); }, "groups[0].lr");
  CHECK(opt.step_count() == 0);
  CHECK(p == std::vector<float>(8, 1.f));
  expect_error([&] { opt.group(3); }, "group index 3");
  expect_error([&] { opt.state_data("exp_avg_sqq"); }, "unknown optimizer state 'exp_avg_sqq'");
  std::vector<float> buf(8);
  expect_error([&] { opt.read_state("exp_avg", "w", 5, 2, buf.data()); }, "param_begin (5) > param_end (2)");
  expect_error([&] { opt.write_state("exp_avg", "w", 0, 4, nullptr); }, "in is null");
  expect_error([&] { opt.set_step_count(-1); }, "step_count must be >= 0");
  expect_error([] { parse_optimizer("adamax"); }, "unknown optimizer 'adamax'");
  CHECK(parse_optimizer("lion") == OptimizerKind::kLion);
  for (OptimizerKind k : kAllKinds) CHECK(parse_optimizer(optimizer_name(k)) == k);
}

}  // namespace
}  // namespace zero::optim

namespace zero::optim {
namespace {

TEST_CASE("groups of several kinds: labels, state names, and the single-kind optimizer's refusals") {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  Hyper muon;
  muon.kind = OptimizerKind::kMuon;
  Hyper sgd{.momentum = 0.9f};
  sgd.kind = OptimizerKind::kSgd;
  o.groups = {Hyper{}, muon, sgd, Hyper{}};
  CHECK(group_kind(o, 0) == OptimizerKind::kAdamW);
  CHECK(group_kind(o, 1) == OptimizerKind::kMuon);
  CHECK(group_kinds(o) == std::vector<OptimizerKind>{OptimizerKind::kAdamW, OptimizerKind::kMuon, OptimizerKind::kSgd});
  CHECK(optimizer_label(o) == "adamw+muon+sgd");
  // Each kind's states once, in the order the groups first use them (Muon's and SGD's share a name).
  CHECK(optimizer_state_names(o) == std::vector<std::string>{"exp_avg", "exp_avg_sq", "momentum_buffer"});
  CHECK(has_matrix_groups(o));
  CHECK(parse_optimizer("muon") == OptimizerKind::kMuon);
  CHECK_THROWS_WITH_AS(group_kind(o, 4), doctest::Contains("group index 4 out of range"), InvalidArgument);
  // optim::Optimizer runs one elementwise kind: Muon and a second kind are the engine's.
  const std::vector<Segment> segs{Segment{0, 16, 0, "w", 0}};
  CHECK_THROWS_WITH_AS(Optimizer(o, 16, segs), doctest::Contains("groups[1].kind: optim::Optimizer runs elementwise rules"),
                       InvalidArgument);
  o.groups = {Hyper{}, sgd};
  CHECK_THROWS_WITH_AS(Optimizer(o, 16, segs), doctest::Contains("groups[1].kind: optim::Optimizer runs one rule (adamw)"),
                       InvalidArgument);
  // Every group naming the same kind is that kind.
  Hyper adamw;
  adamw.kind = OptimizerKind::kAdamW;
  o.groups = {adamw};
  CHECK(optimizer_label(o) == "adamw");
  CHECK_NOTHROW(Optimizer(o, 16, segs));
  // Muon's hyperparameters are validated by name.
  Hyper bad = muon;
  bad.muon.momentum = 1.0f;
  o.groups = {Hyper{}, bad};
  CHECK_THROWS_WITH_AS(validate_groups(o), doctest::Contains("groups[1].muon.momentum"), InvalidArgument);
  // A custom rule runs every group: a group naming a kind beside it is refused.
  class Plain final : public CustomOptimizer {
   public:
    std::string name() const override { return "plain"; }
    std::vector<std::string> state_names() const override { return {}; }
    void update(const UpdateContext&, const OwnedRange&) override {}
  };
  o.custom = std::make_shared<Plain>();
  o.groups = {Hyper{}, muon};
  CHECK_THROWS_WITH_AS(validate_groups(o), doctest::Contains("groups[1].kind is muon but the custom optimizer 'plain'"),
                       InvalidArgument);
}

}  // namespace
TEST_CASE("name patterns: '*' any run, '?' one character; group_by_name finds one group or names both") {
  CHECK(name_matches("h.*.attn.*.weight", "h.0.attn.c_attn.weight"));
  CHECK(name_matches("h.*.attn.*.weight", "h.11.attn.c_proj.weight"));
  CHECK_FALSE(name_matches("h.*.attn.*.weight", "h.0.mlp.c_fc.weight"));
  CHECK_FALSE(name_matches("h.*.attn.*.weight", "h.0.attn.c_attn.bias"));
  CHECK(name_matches("*", ""));
  CHECK(name_matches("*.b", "h0.b"));
  CHECK_FALSE(name_matches("*.b", "h0.bb"));
  CHECK(name_matches("ln.?", "ln.g"));
  CHECK_FALSE(name_matches("ln.?", "ln.gg"));
  CHECK(name_matches("a*b*c", "aXbYbZc"));
  CHECK_FALSE(name_matches("a*b*c", "aXbYbZ"));
  CHECK(name_matches("wte.weight", "wte.weight"));
  CHECK_FALSE(name_matches("wte.weight", "wte.weights"));

  OptimizerOptions o;
  o.groups = {Hyper{}, Hyper{}, Hyper{}};
  o.groups[1].params = {"*.bias", "ln_f.*"};
  o.groups[2].params = {"h.*.weight"};
  CHECK(group_by_name(o, "wte.weight") == std::nullopt);
  CHECK(group_by_name(o, "h.0.attn.c_attn.bias") == 1);
  CHECK(group_by_name(o, "ln_f.weight") == 1);
  CHECK(group_by_name(o, "h.3.mlp.c_fc.weight") == 2);
  o.groups[0].params = {"h.0.*"};
  CHECK_THROWS_WITH_AS(group_by_name(o, "h.0.mlp.c_fc.weight"),
                       "parameter 'h.0.mlp.c_fc.weight' is matched by groups[0].params ('h.0.*') and by "
                       "groups[2].params ('h.*.weight'): a parameter belongs to one group",
                       InvalidArgument);
}

TEST_CASE("Adafactor's first moment: beta1 in [0, 1), and its state named apart from AdamW's") {
  OptimizerOptions o;
  o.groups = {Hyper{.kind = OptimizerKind::kAdafactor}, Hyper{}};
  const std::vector<std::string> without = optimizer_state_names(o);
  CHECK(std::count(without.begin(), without.end(), "exp_avg_update") == 0);
  CHECK_FALSE(adafactor_first_moment(o));
  o.groups[0].adafactor.beta1 = 0.9f;
  CHECK(adafactor_first_moment(o));
  const std::vector<std::string> names = optimizer_state_names(o);
  CHECK(std::count(names.begin(), names.end(), "exp_avg_update") == 1);
  o.groups[0].adafactor.beta1 = 1.0f;
  CHECK_THROWS_WITH_AS(validate_groups(o), "groups[0].adafactor.beta1 must be in [0, 1) (got 1)", InvalidArgument);
}

}  // namespace zero::optim
