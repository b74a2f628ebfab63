#pragma once
// The CUDA MLP's elementwise and per-row kernels (the matrix products are cuBLAS's). Row-major
// matrices of `rows` x `cols` floats; each launcher enqueues on `stream` and returns at once.
#include <cuda_runtime.h>

namespace zero::examples::cuda {

// pre = z + b (per column); h = max(pre, 0).
void bias_relu(const float* z, const float* b, float* pre, float* h, int rows, int cols, cudaStream_t stream);
// z += b (per column), in place.
void bias_add(float* z, const float* b, int rows, int cols, cudaStream_t stream);
// Per row: probs = softmax(logits), row_loss = -log(max(probs[label], 1e-30)).
void softmax_xent(const float* logits, const int* labels, float* probs, float* row_loss, int rows, int cols,
                  cudaStream_t stream);
// *mean = the mean of row_loss[0, rows), summed in row order by one thread.
void mean_loss(const float* row_loss, int rows, float* mean, cudaStream_t stream);
// d = (probs - onehot(label)) * scale / rows.
void xent_backward(const float* probs, const int* labels, float* d, float scale, int rows, int cols,
                   cudaStream_t stream);
// gb[j] += sum over rows of d[i][j], in row order.
void bias_grad(const float* d, float* gb, int rows, int cols, cudaStream_t stream);
// d = dh where pre > 0, else 0.
void relu_backward(const float* dh, const float* pre, float* d, int n, cudaStream_t stream);

}  // namespace zero::examples::cuda
