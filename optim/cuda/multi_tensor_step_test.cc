// The CUDA multi-tensor step against the CPU optimizer: every optimizer, every gradient / state /
// copy-out dtype, two groups and padding, several steps; master, copy-out and state must be bitwise
// equal. Also a list long enough for several launches.
//
// Prints ZERO_TEST_SKIPPED in CPU builds and in CUDA builds without a device (after checking the
// argument validation, which needs no device).
#include <doctest/doctest.h>

#include <cstdio>

#ifdef ZERO_WITH_CUDA
#include <cuda_runtime.h>

#include "optim/cuda/gpu_test_util.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "optim/cuda/multi_tensor_step.h"
#include "optim/optimizer.h"
#include "optim/step_coeffs.h"
#endif

namespace {

#ifndef ZERO_WITH_CUDA

TEST_CASE("CUDA multi-tensor step") {
  std::printf("ZERO_TEST_SKIPPED: CPU build (no --config=cuda)\n");
}

#else

using namespace zero;
using namespace zero::optim;

using optim::cuda::testing::DeviceBytes;
using optim::cuda::testing::have_gpu;

const OptimizerKind kAllKinds[] = {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd,
                                   OptimizerKind::kAdagrad, OptimizerKind::kLion};

std::vector<Hyper> groups_for(OptimizerKind kind) {
  Hyper a, b;
  a.lr = 2e-3f;
  b.lr = 1e-3f;
  a.weight_decay = 0.1f;
  switch (kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam:
      a.beta1 = 0.8f;
      a.beta2 = 0.99f;
      a.eps = 1e-6f;
      break;
    case OptimizerKind::kSgd:
      a.momentum = 0.9f;
      a.dampening = 0.1f;
      b.momentum = 0.0f;  // no buffer for this group
      break;
    case OptimizerKind::kAdagrad:
      a.lr_decay = 0.1f;
      a.eps = 1e-10f;
      b.eps = 1e-10f;
      a.initial_accumulator_value = 0.25f;
      break;
    case OptimizerKind::kLion:
      a.beta2 = 0.99f;
      break;
    case OptimizerKind::kMuon:  // not elementwise: no kernel
    case OptimizerKind::kAdamW8bit:
    case OptimizerKind::kAdafactor:
      break;
  }
  return {a, b};
}

std::vector<uint16_t> to16(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = t == DType::kFloat16 ? fp32_to_fp16_bits(v[i]) : fp32_to_bf16_bits(v[i]);
  }
  return out;
}

// Runs `steps` steps on the CPU optimizer and on the device over the same segments; compares.
void compare(OptimizerKind kind, DType grad_dtype, DType state_dtype, bool copy_out, DType model_dtype,
             const std::vector<Segment>& segments, size_t numel, int steps) {
  CAPTURE(optimizer_name(kind));
  CAPTURE(dtype_name(grad_dtype));
  CAPTURE(dtype_name(state_dtype));
  CAPTURE(copy_out);
  CAPTURE(dtype_name(model_dtype));
  OptimizerOptions o;
  o.kind = kind;
  o.groups = groups_for(kind);
  o.state_dtype = state_dtype;
  Optimizer cpu(o, numel, segments);

  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> master(numel);
  for (float& x : master) x = dist(rng);

  const size_t gsize = dtype_size(grad_dtype), ssize = dtype_size(state_dtype);
  const size_t osize = dtype_size(model_dtype);
  DeviceBytes d_master(numel * 4), d_grad(numel * gsize), d_out(numel * osize);
  DeviceBytes d_s0(numel * ssize), d_s1(numel * ssize);
  d_master.upload(master.data());
  // The initial state (Adagrad's accumulator) comes from the CPU optimizer.
  const std::vector<std::string> names = cpu.state_names();
  d_s0.upload(cpu.state_data(names[0]));
  if (names.size() > 1) d_s1.upload(cpu.state_data(names[1]));

  std::vector<char> out_host(numel * osize, 0);
  for (int s = 1; s <= steps; ++s) {
    std::vector<float> gf(numel);
    for (float& x : gf) x = dist(rng) * 0.1f;
    const std::vector<uint16_t> g16 = to16(gf, grad_dtype);
    const void* ghost = grad_dtype == DType::kFloat32 ? static_cast<const void*>(gf.data()) : g16.data();
    d_grad.upload(ghost);
    const float grad_scale = 0.5f;

    StepInput in;
    in.master = master.data();
    in.grad = ghost;
    in.grad_dtype = grad_dtype;
    in.grad_scale = grad_scale;
    if (copy_out) {
      in.model_out = out_host.data();
      in.model_dtype = model_dtype;
    }
    cpu.step(in);

    std::vector<cuda::DeviceRange> ranges;
    for (const Segment& seg : segments) {
      if (seg.param_name.empty()) continue;
      cuda::DeviceRange r;
      r.master = reinterpret_cast<float*>(d_master.get()) + seg.begin;
      r.grad = d_grad.get() + seg.begin * gsize;
      r.state0 = d_s0.get() + seg.begin * ssize;
      r.state1 = d_s1.get() + seg.begin * ssize;
      r.model_out = d_out.get() + seg.begin * osize;
      r.n = seg.end - seg.begin;
      const Hyper& h = o.groups[static_cast<size_t>(seg.group)];
      r.coeffs = compute_step_coeffs(kind, h, s, grad_scale, /*sgd_first_momentum_step=*/s == 1);
      ranges.push_back(r);
    }
    cuda::DeviceStepConfig config;
    config.kind = kind;
    config.grad_dtype = grad_dtype;
    config.state_dtype = state_dtype;
    config.copy_out = copy_out;
    config.model_dtype = model_dtype;
    CHECK(cuda::multi_tensor_step(config, ranges, nullptr) ==
          static_cast<int>((ranges.size() + cuda::kMaxRangesPerLaunch - 1) / cuda::kMaxRangesPerLaunch));
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

    const std::vector<char> dm = d_master.download();
    REQUIRE(std::memcmp(dm.data(), master.data(), numel * 4) == 0);
    if (copy_out) {
      const std::vector<char> dout = d_out.download();
      REQUIRE(std::memcmp(dout.data(), out_host.data(), numel * osize) == 0);
    }
  }
  const std::vector<char> ds0 = d_s0.download();
  REQUIRE(std::memcmp(ds0.data(), cpu.state_data(names[0]), numel * ssize) == 0);
  if (names.size() > 1) {
    const std::vector<char> ds1 = d_s1.download();
    REQUIRE(std::memcmp(ds1.data(), cpu.state_data(names[1]), numel * ssize) == 0);
  }
}

TEST_CASE("argument validation needs no device") {
  cuda::DeviceStepConfig bad;
  bad.grad_dtype = DType::kFloat64;
  CHECK_THROWS_AS(cuda::multi_tensor_step(bad, {}, nullptr), InvalidArgument);
  cuda::DeviceStepConfig ok;
  cuda::DeviceRange r;
  r.n = 10;  // null pointers
  CHECK_THROWS_AS(cuda::multi_tensor_step(ok, std::span<const cuda::DeviceRange>(&r, 1), nullptr),
                  InvalidArgument);
}

TEST_CASE("device step equals the CPU step bit for bit") {
  if (!have_gpu()) return;
  // Group 0 [0, 30000), padding [30000, 30005), group 1 [30005, 70001): odd lengths, padding between.
  const size_t numel = 70001;
  const std::vector<Segment> segments = {Segment{0, 30000, 0, "a", 0}, Segment{30005, numel, 1, "b", 0}};
  for (OptimizerKind kind : kAllKinds) {
    for (DType g : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (DType s : {DType::kFloat32, DType::kBFloat16}) {
        compare(kind, g, s, false, DType::kBFloat16, segments, numel, 3);
      }
    }
    for (DType out : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      compare(kind, DType::kBFloat16, DType::kFloat32, true, out, segments, numel, 3);
    }
  }
}

TEST_CASE("a list of 300 ranges takes three launches and matches the CPU") {
  if (!have_gpu()) return;
  std::vector<Segment> segments;
  size_t at = 0;
  for (size_t i = 0; i < 300; ++i) {
    const size_t n = 1 + (i * 37) % 5000;
    segments.push_back(Segment{at, at + n, static_cast<int>(i % 2), "p" + std::to_string(i), 0});
    at += n + (i % 3);  // some padding
  }
  compare(OptimizerKind::kAdamW, DType::kBFloat16, DType::kFloat32, true, DType::kBFloat16, segments,
          at, 2);
}

#endif

}  // namespace
