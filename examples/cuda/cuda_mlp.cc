#include "examples/cuda/cuda_mlp.h"

#include <algorithm>

#include "base/check.h"
#include "base/error.h"
#include "examples/cuda/mlp_kernels.h"

namespace zero::examples::cuda {
namespace {

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) ZERO_THROW(Error, "cuBLAS {} failed with status {}", what, static_cast<int>(s));
}

// Row-major products through column-major cuBLAS: a row-major r x c matrix is its transpose in
// column-major order with leading dimension c.
//   C (m x n) = A (m x k) * B (k x n)           forward:  z = h * W
void matmul(cublasHandle_t h, const float* a, const float* b, float* c, int m, int k, int n) {
  const float one = 1.0f, zero = 0.0f;
  check_blas(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b, n, a, k, &zero, c, n), "h * W");
}
//   C (k x n) += A^T (k x m) * D (m x n)        weight gradient: gW += in^T * d
void matmul_at_accumulate(cublasHandle_t h, const float* a, const float* d, float* c, int m, int k, int n) {
  const float one = 1.0f;
  check_blas(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, n, k, m, &one, d, n, a, k, &one, c, n), "in^T * d");
}
//   C (m x k) = D (m x n) * W^T (n x k)         input gradient: dh = d * W^T
void matmul_bt(cublasHandle_t h, const float* d, const float* w, float* c, int m, int n, int k) {
  const float one = 1.0f, zero = 0.0f;
  check_blas(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, k, m, n, &one, w, n, d, n, &zero, c, k), "d * W^T");
}

}  // namespace

CudaMlp::CudaMlp(const Mlp& host, memory::Device& device, cudaStream_t stream) : device_(device), stream_(stream) {
  ZERO_CHECK(device.kind() == memory::DeviceKind::kCuda, "CudaMlp needs a CUDA device, not {}", device.name());
  check_blas(cublasCreate(&blas_), "cublasCreate");
  check_blas(cublasSetStream(blas_, stream_), "cublasSetStream");
  // fp32 products in fp32 (no TF32), as the host MLP computes them.
  check_blas(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
  const std::vector<Mlp::Param>& ps = host.params();
  widths_.push_back(static_cast<int>(ps[0].shape[0]));
  for (size_t i = 0; i < ps.size(); i += 2) widths_.push_back(static_cast<int>(ps[i].shape[1]));
  memory::Stream& compute = device_.compute_stream();
  for (const Mlp::Param& p : ps) {
    numel_.push_back(p.values.size());
    params_.push_back(device_.allocate(p.values.size() * sizeof(float), memory::Category::kParams));
    device_.copy(params_.back().data(), p.values.data(), p.values.size() * sizeof(float), compute);
  }
  // The copies read the host model's pageable memory: done before the constructor returns.
  device_.synchronize(compute, std::chrono::minutes(1));
  loss_ = device_.allocate(sizeof(float), memory::Category::kOther);
}

CudaMlp::~CudaMlp() {
  if (blas_) cublasDestroy(blas_);
}

void CudaMlp::ensure_rows(int rows) {
  if (rows <= rows_) return;
  rows_ = rows;
  const size_t layers = widths_.size() - 1;
  z_.clear();
  pre_.clear();
  acts_.clear();
  auto buffer = [&](size_t n) { return device_.allocate(n * sizeof(float), memory::Category::kOther); };
  int widest = *std::max_element(widths_.begin(), widths_.end());
  for (size_t l = 0; l < layers; ++l) {
    z_.push_back(buffer(static_cast<size_t>(rows) * widths_[l + 1]));
    pre_.push_back(buffer(static_cast<size_t>(rows) * widths_[l + 1]));
    acts_.push_back(buffer(static_cast<size_t>(rows) * widths_[l + 1]));
  }
  probs_ = buffer(static_cast<size_t>(rows) * widths_.back());
  row_loss_ = buffer(static_cast<size_t>(rows));
  d_ = buffer(static_cast<size_t>(rows) * widest);
  dh_ = buffer(static_cast<size_t>(rows) * widest);
}

void CudaMlp::forward(const float* x, const int* labels, int rows, const Mlp::Access& access) {
  ZERO_CHECK_GT(rows, 0);
  ensure_rows(rows);
  batch_ = rows;
  x_ = x;
  labels_ = labels;
  const size_t layers = widths_.size() - 1;
  const float* h = x;
  for (size_t l = 0; l < layers; ++l) {
    const int in = widths_[l], out = widths_[l + 1];
    access.enter(l, false);
    matmul(blas_, h, value(access, 2 * l), z_[l].as<float>(), rows, in, out);
    if (l + 1 < layers) {
      bias_relu(z_[l].as<float>(), value(access, 2 * l + 1), pre_[l].as<float>(), acts_[l].as<float>(), rows, out,
                stream_);
      h = acts_[l].as<float>();
    } else {
      bias_add(z_[l].as<float>(), value(access, 2 * l + 1), rows, out, stream_);
    }
    access.leave(l, false);
  }
  softmax_xent(z_[layers - 1].as<float>(), labels, probs_.as<float>(), row_loss_.as<float>(), rows, widths_.back(),
               stream_);
  mean_loss(row_loss_.as<float>(), rows, loss_.as<float>(), stream_);
}

void CudaMlp::backward(float loss_scale, const std::function<float*(size_t)>& grad,
                       const std::function<void(size_t)>& ready, const Mlp::Access& access) {
  ZERO_CHECK(x_ != nullptr, "backward() before forward()");
  const size_t layers = widths_.size() - 1;
  const int rows = batch_;
  float* d = d_.as<float>();
  float* dh = dh_.as<float>();
  xent_backward(probs_.as<float>(), labels_, d, loss_scale, rows, widths_.back(), stream_);
  for (size_t l = layers; l-- > 0;) {
    const int in = widths_[l], out = widths_[l + 1];
    const float* input = l == 0 ? x_ : acts_[l - 1].as<float>();
    access.enter(l, true);
    matmul_at_accumulate(blas_, input, d, grad(2 * l), rows, in, out);
    ready(2 * l);
    bias_grad(d, grad(2 * l + 1), rows, out, stream_);
    ready(2 * l + 1);
    if (l == 0) {
      access.leave(l, true);
      break;
    }
    matmul_bt(blas_, d, value(access, 2 * l), dh, rows, out, in);
    access.leave(l, true);
    relu_backward(dh, pre_[l - 1].as<float>(), d, rows * in, stream_);
  }
}

}  // namespace zero::examples::cuda
