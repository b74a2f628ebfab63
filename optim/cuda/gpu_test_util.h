#pragma once
// Tests only, CUDA builds only: what the optim/cuda GPU tests share — the device check that prints
// the skip marker, and a zero-filled device allocation.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

namespace zero::optim::cuda::testing {

// True with a CUDA device; otherwise prints the skip marker (scripts/testlog.sh) and returns false.
inline bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();  // clear the sticky "no driver" error
    std::printf("ZERO_TEST_SKIPPED: no CUDA device\n");
    return false;
  }
  return true;
}

// A device allocation, zero-filled when the constructor returns, freed on destruction.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) {
    REQUIRE(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) == cudaSuccess);
    REQUIRE(cudaMemset(ptr_, 0, bytes == 0 ? 1 : bytes) == cudaSuccess);
    // cudaMemset is asynchronous with respect to the host: wait, so "zero on return" holds.
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  ~DeviceBytes() { cudaFree(ptr_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  char* get() const { return static_cast<char*>(ptr_); }
  size_t size() const { return bytes_; }
  void upload(const void* src) const {
    REQUIRE(cudaMemcpy(ptr_, src, bytes_, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<char> download() const {
    std::vector<char> out(bytes_);
    REQUIRE(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

}  // namespace zero::optim::cuda::testing
