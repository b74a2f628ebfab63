// The engine on a GPU: a CUDA device and the NCCL communicator at world size 1, stages 0-3, against
// the same loop on the host device and Gloo, bit for bit (the device kernels and the CUDA optimizer
// reproduce the CPU paths exactly); the optimizer offloaded from the GPU; checkpoints of the GPU's
// state; and its host waits counted on the GPU, as //zero:engine_sync_test counts them on the host
// device. Prints ZERO_TEST_SKIPPED where there is no GPU or no NCCL
// (CPU builds, CI); scripts/gpu_check.sh runs it on a GPU machine.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/store/memory_store.h"
#include "comm/nccl/nccl_communicator.h"
#include "memory/device.h"
#include "testing/sync_counting.h"
#include "zero/engine.h"

namespace zero {
namespace {

using namespace std::chrono_literals;
using Params = std::vector<std::vector<float>>;

const std::vector<size_t> kSizes = {1000, 37, 5000, 3};

// What a run does besides training: a checkpoint loaded before its first step, one saved after a
// given step.
struct Checkpointing {
  std::string load_from;
  std::string save_to;
  int save_after_step = -1;
};

// Trains steps [first_step, 4) on `device` with `comm`; parameters and gradients live in the
// device's memory.
Params train(comm::Communicator& comm, memory::Device& device, int stage, int first_step = 0,
             const Checkpointing& ckpt = {}, bool offload = false) {
  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.kind = optim::OptimizerKind::kAdamW;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
  opt.max_grad_norm = 0.5f;
  opt.timeout = 60s;
  opt.layout = {.alignment = 16, .bucket_numel = 2048, .block = 256};
  opt.offload.optimizer = offload;
  Engine engine(EngineComms{&comm, nullptr, &device}, opt);
  memory::Stream& compute = device.compute_stream();
  std::vector<memory::Buffer> params;
  std::vector<int> ids;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    std::vector<float> init(kSizes[i]);
    for (size_t e = 0; e < init.size(); ++e) init[e] = std::cos(0.01f * static_cast<float>(e) + static_cast<float>(i));
    params.push_back(device.allocate(init.size() * sizeof(float), memory::Category::kParams));
    device.copy(params.back().data(), init.data(), init.size() * sizeof(float), compute);
    device.synchronize(compute, 60s);
    ids.push_back(engine.add_param({.name = "p" + std::to_string(i), .shape = {static_cast<int64_t>(kSizes[i])},
                                    .dtype = DType::kFloat32, .data = {params.back().data(), kSizes[i]},
                                    .unit = static_cast<int>(i)}));
  }
  engine.finalize();
  if (!ckpt.load_from.empty()) engine.load(ckpt.load_from);
  memory::Buffer staging = device.allocate(5000 * sizeof(float), memory::Category::kOther);
  for (int step = first_step; step < 4; ++step) {
    for (size_t i = kSizes.size(); i-- > 0;) {
      UnitScope scope = engine.gather_for_backward(static_cast<int>(i));
      std::vector<float> g(kSizes[i]);
      for (size_t e = 0; e < g.size(); ++e) g[e] = 0.02f * std::sin(0.3f * static_cast<float>(e) + static_cast<float>(step + i));
      device.copy(staging.data(), g.data(), g.size() * sizeof(float), compute);
      device.accumulate(scope.grad(ids[i]), DType::kFloat32, staging.data(), DType::kFloat32, g.size(), compute);
      device.synchronize(compute, 60s);  // `g` is pageable host memory that goes out of scope
    }
    engine.step();
    if (step == ckpt.save_after_step) engine.save(ckpt.save_to);
  }
  // Read through scopes: at stage 3 the registered storage is no longer the parameter (it holds NaN).
  Params out;
  EvaluationScope evaluation = engine.evaluation();
  for (size_t i = 0; i < kSizes.size(); ++i) {
    UnitScope scope = engine.gather(static_cast<int>(i));
    out.emplace_back(kSizes[i]);
    device.copy(out.back().data(), scope.param(ids[i]), kSizes[i] * sizeof(float), compute);
    device.synchronize(compute, 60s);  // before the scope's close lets the window reuse the memory
  }
  return out;
}

}  // namespace

TEST_CASE("the engine on CUDA + NCCL equals the engine on the host + Gloo, bit for bit") {
  if (!memory::cuda_device_usable() || !comm::nccl_available()) {
    std::printf("ZERO_TEST_SKIPPED: no GPU or no NCCL in this build\n");
    return;
  }
  auto store = std::make_shared<comm::MemoryStore>();
  auto nccl = comm::make_nccl_communicator(store, 0, 1, {.device = 0});
  auto gloo = comm::make_gloo_communicator(std::make_shared<comm::MemoryStore>(), 0, 1);
  CHECK(nccl->accepts(memory::DeviceKind::kCuda));
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    memory::MemoryTracker gpu_tracker, host_tracker;
    auto gpu = memory::make_cuda_device(0, gpu_tracker);
    auto host = memory::make_host_device(host_tracker);
    CHECK(train(*nccl, *gpu, stage) == train(*gloo, *host, stage));
    // A host communicator with GPU memory is refused at construction.
    CHECK_THROWS_AS(Engine(EngineComms{gloo.get(), nullptr, gpu.get()}, EngineOptions{}), InvalidArgument);
  }
}

TEST_CASE("the optimizer offloaded from the GPU (D2H gradients, the CPU optimizer, H2D values) equals it on the host") {
  if (!memory::cuda_device_usable() || !comm::nccl_available()) {
    std::printf("ZERO_TEST_SKIPPED: no GPU or no NCCL in this build\n");
    return;
  }
  auto nccl = comm::make_nccl_communicator(std::make_shared<comm::MemoryStore>(), 0, 1, {.device = 0});
  auto gloo = comm::make_gloo_communicator(std::make_shared<comm::MemoryStore>(), 0, 1);
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    memory::MemoryTracker gpu_tracker, host_tracker;
    auto gpu = memory::make_cuda_device(0, gpu_tracker);
    auto host = memory::make_host_device(host_tracker);
    const Params on_gpu = train(*nccl, *gpu, stage, 0, {}, /*offload=*/true);
    CHECK(on_gpu == train(*gloo, *host, stage, 0, {}, /*offload=*/true));
    // The CPU optimizer and the CUDA one compute the same bits.
    CHECK(on_gpu == train(*nccl, *gpu, stage));
  }
}

TEST_CASE("a checkpoint of the GPU's state (master and the CUDA optimizer's) resumes bit for bit, on the GPU and the host") {
  if (!memory::cuda_device_usable() || !comm::nccl_available()) {
    std::printf("ZERO_TEST_SKIPPED: no GPU or no NCCL in this build\n");
    return;
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/cuda_ckpt";
  auto nccl = comm::make_nccl_communicator(std::make_shared<comm::MemoryStore>(), 0, 1, {.device = 0});
  auto gloo = comm::make_gloo_communicator(std::make_shared<comm::MemoryStore>(), 0, 1);
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    memory::MemoryTracker gpu_tracker, host_tracker;
    auto gpu = memory::make_cuda_device(0, gpu_tracker);
    auto host = memory::make_host_device(host_tracker);
    const Params whole = train(*nccl, *gpu, stage, 0, {.save_to = dir, .save_after_step = 1});
    CHECK(train(*nccl, *gpu, stage, 2, {.load_from = dir}) == whole);
    CHECK(train(*gloo, *host, stage, 2, {.load_from = dir}) == whole);
  }
}

TEST_CASE("on the GPU the forward and backward make the host wait for nothing; step() once, twice at stage 3") {
  if (!memory::cuda_device_usable() || !comm::nccl_available()) {
    std::printf("ZERO_TEST_SKIPPED: no GPU or no NCCL in this build\n");
    return;
  }
  auto nccl = comm::make_nccl_communicator(std::make_shared<comm::MemoryStore>(), 0, 1, {.device = 0});
  constexpr size_t kNumel = 3000;  // three units of one size: the window reuses their buffers
  constexpr int kUnits = 3, kSteps = 5, kMicro = 2;
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    memory::MemoryTracker tracker;
    auto gpu = memory::make_cuda_device(0, tracker);
    testing::CountingDevice counted(*gpu);
    EngineOptions opt;
    opt.stage = stage;
    opt.optimizer.groups = {optim::Hyper{.lr = 1e-3f}};
    opt.max_grad_norm = 1.0f;
    opt.micro_batches = kMicro;
    opt.timeout = 60s;
    opt.layout = {.alignment = 16, .bucket_numel = 2048, .block = 256};
    Engine engine(EngineComms{nccl.get(), nullptr, &counted}, opt);
    memory::Stream& compute = gpu->compute_stream();
    // Every value the loop adds, staged once in page-locked memory: the loop's own copies need no
    // host wait either (and go to the GPU device directly, uncounted).
    memory::Buffer staged = gpu->allocate_host_staging(kNumel * sizeof(float), memory::Category::kOther);
    for (size_t e = 0; e < kNumel; ++e) staged.as<float>()[e] = 0.001f * static_cast<float>(e % 13);
    memory::Buffer grad_in = gpu->allocate(kNumel * sizeof(float), memory::Category::kOther);
    gpu->copy(grad_in.data(), staged.data(), kNumel * sizeof(float), compute);
    std::vector<memory::Buffer> params;
    std::vector<int> ids;
    for (int k = 0; k < kUnits; ++k) {
      params.push_back(gpu->allocate(kNumel * sizeof(float), memory::Category::kParams));
      ids.push_back(engine.add_param({.name = "u" + std::to_string(k), .shape = {static_cast<int64_t>(kNumel)},
                                      .dtype = DType::kFloat32, .data = {params.back().data(), kNumel}, .unit = k}));
    }
    engine.finalize();
    for (int step = 0; step < kSteps; ++step) {
      const int64_t w0 = counted.host_waits();
      for (int m = 0; m < kMicro; ++m) {
        for (int k = 0; k < kUnits; ++k) {
          UnitScope scope = engine.gather(k);
        }
        for (int k = kUnits; k-- > 0;) {
          UnitScope scope = engine.gather_for_backward(k);
          gpu->accumulate(scope.grad(ids[static_cast<size_t>(k)]), DType::kFloat32, grad_in.data(), DType::kFloat32,
                          kNumel, compute);
        }
        engine.finish_backward();
      }
      const int64_t w1 = counted.host_waits();
      engine.step();
      const int64_t w2 = counted.host_waits();
      std::printf("stage %d step %d on the GPU: forward+backward %lld host waits, step %lld\n", stage, step,
                  static_cast<long long>(w1 - w0), static_cast<long long>(w2 - w1));
      CAPTURE(step);
      if (static_cast<size_t>(step) < testing::kEngineWarmUpSteps) continue;
      CHECK(w1 - w0 == 0);
      CHECK(w2 - w1 == (stage == 3 ? 2 : 1));
    }
    gpu->synchronize(compute, 60s);
  }
}

}  // namespace zero
