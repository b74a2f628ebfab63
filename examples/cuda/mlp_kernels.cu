#include "examples/cuda/mlp_kernels.h"

#include <cmath>

namespace zero::examples::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int n) { return (n + kThreads - 1) / kThreads; }

__global__ void bias_relu_kernel(const float* z, const float* b, float* pre, float* h, int rows, int cols) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const float v = z[i] + b[i % cols];
  pre[i] = v;
  h[i] = v > 0.0f ? v : 0.0f;
}

__global__ void bias_add_kernel(float* z, const float* b, int rows, int cols) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows * cols) z[i] += b[i % cols];
}

__global__ void softmax_xent_kernel(const float* logits, const int* labels, float* probs, float* row_loss, int rows,
                                    int cols) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* x = logits + static_cast<size_t>(r) * cols;
  float* p = probs + static_cast<size_t>(r) * cols;
  float m = x[0];
  for (int j = 1; j < cols; ++j) m = fmaxf(m, x[j]);
  float s = 0.0f;
  for (int j = 0; j < cols; ++j) {
    p[j] = expf(x[j] - m);
    s += p[j];
  }
  for (int j = 0; j < cols; ++j) p[j] /= s;
  row_loss[r] = -logf(fmaxf(p[labels[r]], 1e-30f));
}

__global__ void mean_loss_kernel(const float* row_loss, int rows, float* mean) {
  float s = 0.0f;
  for (int r = 0; r < rows; ++r) s += row_loss[r];
  *mean = s / static_cast<float>(rows);
}

__global__ void xent_backward_kernel(const float* probs, const int* labels, float* d, float scale, int rows,
                                     int cols) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int r = i / cols, j = i % cols;
  d[i] = (probs[i] - (labels[r] == j ? 1.0f : 0.0f)) * (scale / static_cast<float>(rows));
}

__global__ void bias_grad_kernel(const float* d, float* gb, int rows, int cols) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float s = 0.0f;
  for (int r = 0; r < rows; ++r) s += d[static_cast<size_t>(r) * cols + j];
  gb[j] += s;
}

__global__ void relu_backward_kernel(const float* dh, const float* pre, float* d, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = pre[i] > 0.0f ? dh[i] : 0.0f;
}

}  // namespace

void bias_relu(const float* z, const float* b, float* pre, float* h, int rows, int cols, cudaStream_t stream) {
  bias_relu_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(z, b, pre, h, rows, cols);
}

void bias_add(float* z, const float* b, int rows, int cols, cudaStream_t stream) {
  bias_add_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(z, b, rows, cols);
}

void softmax_xent(const float* logits, const int* labels, float* probs, float* row_loss, int rows, int cols,
                  cudaStream_t stream) {
  softmax_xent_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(logits, labels, probs, row_loss, rows, cols);
}

void mean_loss(const float* row_loss, int rows, float* mean, cudaStream_t stream) {
  mean_loss_kernel<<<1, 1, 0, stream>>>(row_loss, rows, mean);
}

void xent_backward(const float* probs, const int* labels, float* d, float scale, int rows, int cols,
                   cudaStream_t stream) {
  xent_backward_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(probs, labels, d, scale, rows, cols);
}

void bias_grad(const float* d, float* gb, int rows, int cols, cudaStream_t stream) {
  bias_grad_kernel<<<blocks_for(cols), kThreads, 0, stream>>>(d, gb, rows, cols);
}

void relu_backward(const float* dh, const float* pre, float* d, int n, cudaStream_t stream) {
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dh, pre, d, n);
}

}  // namespace zero::examples::cuda
