// gpu_optim_bench: the CUDA optimizer step's throughput against the device's own copy bandwidth,
// measured in the same run (the GPU rows of optim_bench; scripts/gpu_check.sh runs it).
//
//   gpu_optim_bench [--sizes=16,64]   (millions of parameters)
//
// AdamW in fp32 reads p, g, m, v and writes p, m, v: 28 bytes per parameter; with a bf16 copy-out
// (the model's own weights) 30. A device-to-device cudaMemcpy of B bytes reads B and writes B: its
// rate, counted the same way (2B / time), is what a memory-bound kernel can reach. Times are the
// best of 5 rounds of 10 steps, by CUDA events. Without a GPU it says so and exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "optim/cuda/multi_tensor_step.h"
#include "optim/optimizer.h"
#include "optim/step_coeffs.h"

namespace zero::optim::cuda {
namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gpu_optim_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Best time in seconds of `rounds` rounds of `reps` calls of fn (enqueued on `stream`).
template <typename Fn>
double best_seconds(cudaStream_t stream, int rounds, int reps, Fn fn) {
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "cudaEventCreate");
  ok(cudaEventCreate(&b), "cudaEventCreate");
  fn();  // warm-up
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    ok(cudaEventRecord(a, stream), "cudaEventRecord");
    for (int i = 0; i < reps; ++i) fn();
    ok(cudaEventRecord(b, stream), "cudaEventRecord");
    ok(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    best = std::min(best, ms / 1e3 / reps);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

void* device_zeros(size_t bytes) {
  void* p = nullptr;
  ok(cudaMalloc(&p, bytes), "cudaMalloc");
  ok(cudaMemset(p, 0, bytes), "cudaMemset");
  return p;
}

int run(const std::vector<int>& sizes_m) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    std::printf("gpu_optim_bench: skipped: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s\n", prop.name);
  cudaStream_t stream;
  ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::printf("| params | step | ms | GB/s | copy GB/s | fraction of copy |\n| --- | --- | --- | --- | --- | --- |\n");
  for (int m : sizes_m) {
    const size_t n = static_cast<size_t>(m) << 20;
    auto* p = static_cast<float*>(device_zeros(n * 4));
    void* g = device_zeros(n * 4);
    void* m1 = device_zeros(n * 4);
    void* v = device_zeros(n * 4);
    void* out = device_zeros(n * 2);
    void* copy_dst = device_zeros(n * 4);
    const double copy_s = best_seconds(stream, 5, 10, [&] {
      ok(cudaMemcpyAsync(copy_dst, g, n * 4, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    });
    const double copy_gbs = 2.0 * n * 4 / copy_s / 1e9;
    Hyper h;
    h.lr = 1e-3f;
    h.weight_decay = 0.01f;
    for (bool copy_out : {false, true}) {
      DeviceStepConfig config;
      config.kind = OptimizerKind::kAdamW;
      config.copy_out = copy_out;
      config.model_dtype = DType::kBFloat16;
      DeviceRange range;
      range.master = p;
      range.grad = g;
      range.state0 = m1;
      range.state1 = v;
      range.model_out = copy_out ? out : nullptr;
      range.n = n;
      range.coeffs = compute_step_coeffs(OptimizerKind::kAdamW, h, 1, 1.0f, true);
      const double s = best_seconds(stream, 5, 10, [&] {
        multi_tensor_step(config, std::span<const DeviceRange>(&range, 1), stream);
      });
      const double bytes = (copy_out ? 30.0 : 28.0) * n;
      std::printf("| %dM | AdamW fp32%s | %.3f | %.0f | %.0f | %.2f |\n", m, copy_out ? " + bf16 copy-out" : "",
                  s * 1e3, bytes / s / 1e9, copy_gbs, bytes / s / 1e9 / copy_gbs);
    }
    for (void* q : {static_cast<void*>(p), g, m1, v, out, copy_dst}) cudaFree(q);
  }
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace zero::optim::cuda

int main(int argc, char** argv) {
  std::vector<int> sizes = {16, 64};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--sizes=", 0) == 0) {
      sizes.clear();
      std::string list = a.substr(8);
      for (size_t pos = 0; pos <= list.size();) {
        const size_t next = list.find(',', pos);
        sizes.push_back(std::atoi(list.substr(pos, next - pos).c_str()));
        if (next == std::string::npos) break;
        pos = next + 1;
      }
    } else {
      std::fprintf(stderr, "gpu_optim_bench: unknown argument '%s' (usage: gpu_optim_bench [--sizes=16,64])\n", a.c_str());
      return 2;
    }
  }
  for (int s : sizes) {
    if (s <= 0 || s > 4096) {
      std::fprintf(stderr, "gpu_optim_bench: --sizes: %d is not a size in millions of parameters (1-4096)\n", s);
      return 2;
    }
  }
  return zero::optim::cuda::run(sizes);
}
