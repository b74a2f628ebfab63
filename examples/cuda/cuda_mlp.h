#pragma once
// The examples' MLP (examples/mlp.h) on a GPU: the same layers, initial values and loss, with the
// matrix products on cuBLAS and the rest in examples/cuda/mlp_kernels.cu, everything enqueued on one
// CUDA stream (the engine's compute stream) without a host wait. Parameters, activations and
// gradients are device memory; the engine's scopes hand it gathered device parameters at stage 3
// exactly as they hand the host MLP host ones (Mlp::Access).
//
// Its results are the host MLP's up to the order of fp32 sums (cuBLAS's GEMMs against Eigen's):
// //examples/cuda:cuda_mlp_test compares the loss curves.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "examples/mlp.h"
#include "memory/device.h"

namespace zero::examples::cuda {

class CudaMlp {
 public:
  // `host`'s shapes and current values, copied to `device` (a CUDA device) on `stream`.
  CudaMlp(const Mlp& host, memory::Device& device, cudaStream_t stream);
  ~CudaMlp();
  CudaMlp(const CudaMlp&) = delete;
  CudaMlp& operator=(const CudaMlp&) = delete;

  // Parameter i's device storage (the model's own: what the engine registers), and its size.
  float* param(size_t i) { return params_[i].as<float>(); }
  size_t param_numel(size_t i) const { return numel_[i]; }
  size_t num_params() const { return numel_.size(); }

  // Enqueues the mean softmax cross-entropy of `rows` samples (x: rows x inputs, labels: rows, both
  // device memory, read until the stream passes this call); the value lands in loss() (device).
  void forward(const float* x, const int* labels, int rows, const Mlp::Access& access);
  const float* loss() const { return loss_.as<float>(); }
  // Enqueues the gradients, as Mlp::backward: grad(i) is parameter i's device gradient (+=), ready(i)
  // follows once it is complete in stream order.
  void backward(float loss_scale, const std::function<float*(size_t)>& grad,
                const std::function<void(size_t)>& ready, const Mlp::Access& access);

 private:
  const float* value(const Mlp::Access& access, size_t i) const {
    return access.param ? access.param(i) : params_[i].as<float>();
  }
  void ensure_rows(int rows);

  memory::Device& device_;
  cudaStream_t stream_;
  cublasHandle_t blas_ = nullptr;
  std::vector<int> widths_;  // inputs, hidden..., classes
  std::vector<size_t> numel_;
  std::vector<memory::Buffer> params_;  // W0, b0, W1, b1, ...
  int rows_ = 0;                        // the activations' capacity
  int batch_ = 0;                       // the last forward's rows
  const float* x_ = nullptr;            // the last forward's input and labels
  const int* labels_ = nullptr;
  std::vector<memory::Buffer> z_, pre_, acts_;  // per layer: product, pre-activation, output
  memory::Buffer probs_, row_loss_, loss_, d_, dh_;
};

}  // namespace zero::examples::cuda
