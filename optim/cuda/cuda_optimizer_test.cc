// CudaOptimizer against the CPU Optimizer.
//
// Everywhere (CPU builds included): the constructor rejects the same bad options and segments as
// Optimizer's, with the same message, before calling the allocator or CUDA.
// With a CUDA device: every optimizer x gradient dtype x state dtype, three groups, several segments
// (one parameter split over two groups), padding gaps and padding segments, five steps taken as one
// step() or as begin_step() + three step_range() calls; master, copy-out and state must equal the CPU
// optimizer's bit for bit after every step. Without a device the GPU cases print ZERO_TEST_SKIPPED.
#include "optim/cuda/cuda_optimizer.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "optim/optimizer.h"

#ifdef ZERO_WITH_CUDA
#include <cuda_runtime.h>

#include "optim/cuda/gpu_test_util.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#endif

namespace zero::optim::cuda {
namespace {

// The message of the InvalidArgument that f() throws (or a marker when it throws none).
std::string invalid_argument_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

struct BadCase {
  const char* expect;  // part of the message
  OptimizerOptions options;
  size_t numel = 100;
  std::vector<Segment> segments;
};

std::vector<BadCase> bad_cases() {
  const std::vector<Segment> ok{{0, 50, 0, "a", 0}, {50, 100, 1, "b", 0}};
  const auto with = [](OptimizerKind kind, std::function<void(std::vector<Hyper>&)> edit) {
    OptimizerOptions o;
    o.kind = kind;
    o.groups = {Hyper{}, Hyper{}};
    edit(o.groups);
    return o;
  };
  OptimizerOptions two;
  two.groups = {Hyper{}, Hyper{}};
  std::vector<BadCase> cases;
  cases.push_back({"groups[1].lr", with(OptimizerKind::kAdamW, [](auto& g) { g[1].lr = -1.0f; }), 100,
                   ok});
  cases.push_back({"groups[0].beta1",
                   with(OptimizerKind::kAdam, [](auto& g) { g[0].beta1 = 1.0f; }), 100, ok});
  cases.push_back({"groups[1].eps", with(OptimizerKind::kAdamW, [](auto& g) { g[1].eps = 0.0f; }),
                   100, ok});
  cases.push_back({"groups[0].nesterov", with(OptimizerKind::kSgd, [](auto& g) {
                     g[0].momentum = 0.9f;
                     g[0].nesterov = true;
                     g[0].dampening = 0.1f;
                   }),
                   100, ok});
  cases.push_back({"groups[1].initial_accumulator_value",
                   with(OptimizerKind::kAdagrad, [](auto& g) { g[1].initial_accumulator_value = -1; }),
                   100, ok});
  cases.push_back({"groups[0].lr_decay", with(OptimizerKind::kAdagrad, [](auto& g) {
                     g[0].lr_decay = std::numeric_limits<float>::quiet_NaN();
                   }),
                   100, ok});
  cases.push_back({"groups[1].beta2", with(OptimizerKind::kLion, [](auto& g) { g[1].beta2 = -0.5f; }),
                   100, ok});
  OptimizerOptions empty = two;
  empty.groups.clear();
  cases.push_back({"groups must not be empty", empty, 100, {}});
  OptimizerOptions fp16_state = two;
  fp16_state.state_dtype = DType::kFloat16;
  cases.push_back({"state_dtype", fp16_state, 100, ok});
  OptimizerOptions bad_kind = two;
  bad_kind.kind = static_cast<OptimizerKind>(17);
  cases.push_back({"kind", bad_kind, 100, ok});
  cases.push_back({"segments[1].begin", two, 100, {{0, 50, 0, "a", 0}, {60, 55, 1, "b", 0}}});
  cases.push_back({"segments[1].end (101) > shard_numel", two, 100,
                   {{0, 50, 0, "a", 0}, {50, 101, 1, "b", 0}}});
  cases.push_back({"segments[0].group", two, 100, {{0, 50, 2, "a", 0}, {50, 100, 1, "b", 0}}});
  cases.push_back({"overlaps", two, 100, {{0, 50, 0, "a", 0}, {49, 100, 1, "b", 0}}});
  cases.push_back({"both hold elements", two, 100, {{0, 50, 0, "a", 0}, {50, 100, 1, "a", 10}}});
  return cases;
}

TEST_CASE("the constructor rejects what Optimizer rejects, with its message, before allocating") {
  for (const BadCase& c : bad_cases()) {
    CAPTURE(c.expect);
    const std::string cpu = invalid_argument_of([&] { Optimizer(c.options, c.numel, c.segments); });
    int calls = 0;
    const StateAllocator alloc = [&](size_t, const std::string&) -> void* {
      ++calls;
      return nullptr;
    };
    const std::string gpu = invalid_argument_of([&] {
      CudaOptimizer(c.options, c.numel, c.segments, alloc);
    });
    CHECK(cpu.find(c.expect) != std::string::npos);
    CHECK(gpu == cpu);
    CHECK(calls == 0);
  }
}

TEST_CASE("the constructor needs an allocator") {
  OptimizerOptions o;
  const std::string msg = invalid_argument_of([&] {
    CudaOptimizer(o, 10, {{0, 10, 0, "a", 0}}, StateAllocator{});
  });
  CHECK(msg.find("alloc") != std::string::npos);
}

#ifndef ZERO_WITH_CUDA

TEST_CASE("a CPU build validates, then refuses to construct") {
  OptimizerOptions o;
  o.num_threads = 0;  // the CPU optimizer's own option: ignored here
  int calls = 0;
  const std::string msg = invalid_argument_of([&] {
    CudaOptimizer(o, 10, {{0, 10, 0, "a", 0}}, [&](size_t, const std::string&) -> void* {
      ++calls;
      return nullptr;
    });
  });
  CHECK(msg.find("built without CUDA") != std::string::npos);
  CHECK(calls == 0);
}

TEST_CASE("CudaOptimizer on a device") {
  std::printf("ZERO_TEST_SKIPPED: CPU build (no --config=cuda)\n");
}

#else

using optim::cuda::testing::DeviceBytes;
using optim::cuda::testing::have_gpu;

// A non-blocking stream (so nothing is ordered with it by accident through the legacy stream).
class Stream {
 public:
  Stream() { REQUIRE(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking) == cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* get() const { return s_; }
  void upload(const DeviceBytes& dst, const void* src) const {
    REQUIRE(cudaMemcpyAsync(dst.get(), src, dst.size(), cudaMemcpyHostToDevice, s_) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s_) == cudaSuccess);
  }
  std::vector<char> download(const void* src, size_t bytes) const {
    std::vector<char> out(bytes);
    REQUIRE(cudaMemcpyAsync(out.data(), src, bytes, cudaMemcpyDeviceToHost, s_) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s_) == cudaSuccess);
    return out;
  }

 private:
  cudaStream_t s_ = nullptr;
};

// The test's StateAllocator: owns what it hands out and records the calls.
struct Arena {
  std::vector<std::unique_ptr<DeviceBytes>> blocks;
  std::vector<std::pair<size_t, std::string>> calls;
  StateAllocator allocator() {
    return [this](size_t bytes, const std::string& name) -> void* {
      calls.emplace_back(bytes, name);
      blocks.push_back(std::make_unique<DeviceBytes>(bytes));
      return blocks.back()->get();
    };
  }
};

const OptimizerKind kAllKinds[] = {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd,
                                   OptimizerKind::kAdagrad, OptimizerKind::kLion};

std::vector<Hyper> groups_for(OptimizerKind kind) {
  std::vector<Hyper> g(3);
  g[0].lr = 2e-3f;
  g[1].lr = 1e-3f;
  g[2].lr = 5e-4f;
  g[0].weight_decay = 0.1f;
  g[2].weight_decay = 0.01f;
  switch (kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam:
      g[0].beta1 = 0.8f;
      g[0].beta2 = 0.99f;
      g[0].eps = 1e-6f;
      g[2].beta1 = 0.95f;
      g[2].beta2 = 0.98f;
      break;
    case OptimizerKind::kSgd:
      g[0].momentum = 0.9f;
      g[0].dampening = 0.1f;
      g[1].momentum = 0.0f;  // no buffer for this group
      g[2].momentum = 0.8f;
      g[2].nesterov = true;
      break;
    case OptimizerKind::kAdagrad:
      for (Hyper& h : g) h.eps = 1e-10f;
      g[0].lr_decay = 0.1f;
      g[0].initial_accumulator_value = 0.25f;
      g[2].initial_accumulator_value = 1.5f;  // group 1 starts at zero
      break;
    case OptimizerKind::kLion:
      g[0].beta2 = 0.99f;
      g[2].beta1 = 0.95f;
      g[2].beta2 = 0.98f;
      break;
    case OptimizerKind::kMuon:  // not elementwise: the CUDA optimizer refuses them
    case OptimizerKind::kAdamW8bit:
    case OptimizerKind::kAdafactor:
      break;
  }
  return g;
}

// Out of order on purpose. Padding: the gap [7000, 7013), the padding segment [20000, 20011), the
// tail [40000, 40021). Parameter "a" is split over groups 0 and 1; one segment is empty.
constexpr size_t kNumel = 40021;
std::vector<Segment> test_segments() {
  return {Segment{20011, 33333, 2, "c", 0}, Segment{0, 7000, 0, "a", 0},
          Segment{7013, 20000, 1, "b", 0},  Segment{20000, 20011, 0, "", 0},
          Segment{33333, 40000, 1, "a", 7000}, Segment{40000, 40000, 0, "empty", 0}};
}
// Bucket boundaries for step_range: inside "b", inside "c".
const std::vector<size_t> kCuts = {0, 9001, 30000, kNumel};

std::vector<uint16_t> to16(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = t == DType::kFloat16 ? fp32_to_fp16_bits(v[i]) : fp32_to_bf16_bits(v[i]);
  }
  return out;
}

struct Case {
  OptimizerKind kind = OptimizerKind::kAdamW;
  DType grad_dtype = DType::kFloat32;
  DType state_dtype = DType::kFloat32;
  bool copy_out = true;
  DType model_dtype = DType::kBFloat16;
  bool ranged = false;        // begin_step() + step_range() over kCuts instead of step()
  int64_t start_step = 0;     // set_step_count() before the first step
  std::vector<Segment> segments = test_segments();
  size_t numel = kNumel;
  std::vector<size_t> cuts = kCuts;
  int steps = 5;
};

void check_states(const Optimizer& cpu, const CudaOptimizer& gpu, const Stream& stream) {
  for (const std::string& name : cpu.state_names()) {
    CAPTURE(name);
    const size_t bytes = cpu.shard_numel() * dtype_size(cpu.state_dtype());
    const std::vector<char> d = stream.download(gpu.state_data(name), bytes);
    REQUIRE(std::memcmp(d.data(), cpu.state_data(name), bytes) == 0);
  }
}

void compare(const Case& c) {
  CAPTURE(optimizer_name(c.kind));
  CAPTURE(dtype_name(c.grad_dtype));
  CAPTURE(dtype_name(c.state_dtype));
  CAPTURE(c.copy_out);
  CAPTURE(dtype_name(c.model_dtype));
  CAPTURE(c.ranged);
  CAPTURE(c.start_step);
  OptimizerOptions o;
  o.kind = c.kind;
  o.groups = groups_for(c.kind);
  o.state_dtype = c.state_dtype;
  const size_t n = c.numel;
  Optimizer cpu(o, n, c.segments);
  Stream stream;
  Arena arena;
  CudaOptimizer gpu(o, n, c.segments, arena.allocator(), stream.get());
  REQUIRE(gpu.state_names() == cpu.state_names());
  check_states(cpu, gpu, stream);  // zeros, and Adagrad's initial accumulator per group
  if (c.start_step > 0) {
    cpu.set_step_count(c.start_step);
    gpu.set_step_count(c.start_step);
  }

  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> master(n);
  for (float& x : master) x = dist(rng);
  const size_t gsize = dtype_size(c.grad_dtype), osize = dtype_size(c.model_dtype);
  DeviceBytes d_master(n * 4), d_grad(n * gsize), d_out(n * osize);
  stream.upload(d_master, master.data());
  // A pattern in the copy-out, so that writes into padding would show.
  std::vector<char> out(n * osize, 0x5a);
  stream.upload(d_out, out.data());

  for (int s = 1; s <= c.steps; ++s) {
    CAPTURE(s);
    if (s == 3) {  // a schedule changing a group's lr between steps
      cpu.group(0).lr *= 0.5f;
      gpu.group(0).lr *= 0.5f;
    }
    std::vector<float> gf(n);
    for (float& x : gf) x = dist(rng) * 0.1f;
    const std::vector<uint16_t> g16 = to16(gf, c.grad_dtype);
    const void* ghost = c.grad_dtype == DType::kFloat32 ? static_cast<const void*>(gf.data()) : g16.data();
    stream.upload(d_grad, ghost);
    const float grad_scale = 0.5f + 0.125f * static_cast<float>(s);

    StepInput in;
    in.master = master.data();
    in.grad = ghost;
    in.grad_dtype = c.grad_dtype;
    in.grad_scale = grad_scale;
    if (c.copy_out) {
      in.model_out = out.data();
      in.model_dtype = c.model_dtype;
    }
    cpu.step(in);

    StepInput din = in;
    din.master = reinterpret_cast<float*>(d_master.get());
    din.grad = d_grad.get();
    din.model_out = c.copy_out ? d_out.get() : nullptr;
    if (!c.ranged) {
      din.master_numel = din.grad_numel = din.model_numel = n;
      gpu.step(din, stream.get());
    } else {
      gpu.begin_step();
      for (size_t i = 0; i + 1 < c.cuts.size(); ++i) {
        const size_t b = c.cuts[i], e = c.cuts[i + 1];
        StepInput r = din;
        r.master = din.master + b;
        r.grad = d_grad.get() + b * gsize;
        r.model_out = c.copy_out ? d_out.get() + b * osize : nullptr;
        r.master_numel = r.grad_numel = r.model_numel = e - b;
        gpu.step_range(r, b, e, stream.get());
      }
    }
    REQUIRE(gpu.step_count() == cpu.step_count());

    const std::vector<char> dm = stream.download(d_master.get(), n * 4);
    REQUIRE(std::memcmp(dm.data(), master.data(), n * 4) == 0);
    const std::vector<char> dout = stream.download(d_out.get(), n * osize);
    REQUIRE(std::memcmp(dout.data(), out.data(), n * osize) == 0);
    check_states(cpu, gpu, stream);
  }
}

TEST_CASE("CudaOptimizer equals Optimizer bit for bit") {
  if (!have_gpu()) return;
  for (OptimizerKind kind : kAllKinds) {
    for (DType g : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (DType s : {DType::kFloat32, DType::kBFloat16}) {
        for (bool ranged : {false, true}) {
          Case c;
          c.kind = kind;
          c.grad_dtype = g;
          c.state_dtype = s;
          c.model_dtype = g;  // every copy-out dtype, with each gradient dtype once
          c.ranged = ranged;
          compare(c);
        }
      }
    }
    Case no_out;
    no_out.kind = kind;
    no_out.grad_dtype = DType::kBFloat16;
    no_out.copy_out = false;
    no_out.ranged = true;
    compare(no_out);
    Case resumed;  // as after a checkpoint load: bias corrections and SGD's buffer depend on it
    resumed.kind = kind;
    resumed.start_step = 10;
    compare(resumed);
  }
}

TEST_CASE("more segments than one launch carries, bucket by bucket") {
  if (!have_gpu()) return;
  Case c;
  c.segments.clear();
  size_t at = 0;
  for (size_t i = 0; i < 300; ++i) {
    const size_t len = 1 + (i * 37) % 2000;
    c.segments.push_back(Segment{at, at + len, static_cast<int>(i % 3), "p" + std::to_string(i), 0});
    at += len + (i % 3);  // some padding
  }
  c.numel = at;
  c.cuts = {0, at / 3, at};  // 100+ and 200- segments: one and two launches
  c.grad_dtype = DType::kBFloat16;
  c.ranged = true;
  c.steps = 3;
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdagrad}) {
    c.kind = kind;
    compare(c);
  }
}

TEST_CASE("accessors, the allocator contract and step errors") {
  if (!have_gpu()) return;
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  o.groups = groups_for(o.kind);
  o.state_dtype = DType::kBFloat16;
  o.num_threads = 0;  // the CPU optimizer's option: ignored
  Arena arena;
  CudaOptimizer first(o, kNumel, test_segments(), arena.allocator());
  CudaOptimizer gpu = std::move(first);
  REQUIRE(arena.calls.size() == 2);
  CHECK(arena.calls[0] == std::pair<size_t, std::string>(kNumel * 2, "exp_avg"));
  CHECK(arena.calls[1] == std::pair<size_t, std::string>(kNumel * 2, "exp_avg_sq"));
  CHECK(gpu.state_data("exp_avg") == arena.blocks[0]->get());
  CHECK(gpu.state_data("exp_avg_sq") == arena.blocks[1]->get());
  CHECK_THROWS_AS(gpu.state_data("sum"), InvalidArgument);
  CHECK(gpu.kind() == OptimizerKind::kAdamW);
  CHECK(gpu.shard_numel() == kNumel);
  CHECK(gpu.segments().size() == test_segments().size());
  CHECK(gpu.num_groups() == 3);
  CHECK(gpu.state_dtype() == DType::kBFloat16);
  CHECK_THROWS_AS(gpu.group(3), InvalidArgument);
  CHECK_THROWS_AS(gpu.set_step_count(-1), InvalidArgument);

  DeviceBytes master(kNumel * 4), grad(kNumel * 4);
  StepInput in;
  in.master = reinterpret_cast<float*>(master.get());
  in.grad = grad.get();
  CHECK_THROWS_WITH_AS(gpu.step_range(in, 0, kNumel, nullptr), "step_range() before begin_step()",
                       InvalidArgument);
  StepInput bad = in;
  bad.grad_dtype = DType::kFloat64;
  CHECK_THROWS_AS(gpu.step(bad, nullptr), InvalidArgument);
  bad = in;
  bad.master_numel = kNumel - 1;
  CHECK_THROWS_AS(gpu.step(bad, nullptr), InvalidArgument);
  CHECK(gpu.step_count() == 0);  // a rejected input takes no step
  gpu.group(1).beta1 = 1.0f;
  CHECK_THROWS_AS(gpu.begin_step(), InvalidArgument);
  CHECK(gpu.step_count() == 0);
  gpu.group(1).beta1 = 0.9f;
  gpu.begin_step();
  CHECK_THROWS_AS(gpu.step_range(in, 10, kNumel + 1, nullptr), InvalidArgument);
  gpu.step_range(in, 0, 0, nullptr);      // nothing to do: no launch
  gpu.step_range(in, 100, 100, nullptr);  // empty, inside a segment: no launch
  gpu.step_range(in, 7000, 7013, nullptr);  // padding only: no launch
  gpu.step_range(in, 0, kNumel, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(gpu.step_count() == 1);
}

#endif

}  // namespace
}  // namespace zero::optim::cuda
