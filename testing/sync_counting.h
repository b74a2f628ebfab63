#pragma once
// Wrappers that count what the engine makes the host wait for, for the tests that hold the engine
// to its promise of no host waits on the step's path (zero/engine_sync_test.cc and its CUDA twin):
//
//   CountingDevice         forwards every call to a Device and counts the host waits
//                          (synchronize on an event or a stream) and the allocations.
//   CountingCommunicator   forwards every call to a Communicator and counts the calls issued
//                          (collectives and point-to-point), over it and the groups split from it,
//                          and the bytes its all-gathers deliver to this rank (the traffic a
//                          gather dtype changes: zero/param_dtype_test.cc).
//
// With a host communicator (Gloo) every collective the engine issues costs exactly one host wait:
// its buffers' producers must be complete before Gloo's threads read them (zero/collective_order.h).
// With NCCL it costs none. So the waits the engine adds of its own are
//   host waits - (host communicator ? calls issued : 0),
// which is the number the tests check: the same on the host device as on a GPU.
// Header-only, testonly. Thread-safe counters; the forwarded objects keep their own contracts.
#include <array>
#include <atomic>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "memory/device.h"

namespace zero::testing {

// The steps that set the engine's transient buffers up, in which it may allocate and wait: the
// first (each transient buffer on its own until the step's end sizes the slabs) and the second
// (stage 3's first with prefetch places its units anew). The contracts hold from the third step on.
constexpr size_t kEngineWarmUpSteps = 2;

class CountingDevice final : public memory::Device {
 public:
  explicit CountingDevice(memory::Device& inner) : inner_(inner) {}

  int64_t host_waits() const { return host_waits_.load(); }
  int64_t allocations() const { return allocations_.load(); }  // allocate() calls (not staging)

  memory::DeviceKind kind() const override { return inner_.kind(); }
  memory::Location location() const override { return inner_.location(); }
  std::string name() const override { return inner_.name(); }
  memory::MemoryTracker& tracker() override { return inner_.tracker(); }
  memory::Buffer allocate(size_t bytes, memory::Category category) override {
    ++allocations_;
    return inner_.allocate(bytes, category);
  }
  using Device::allocate_host_staging;
  memory::Buffer allocate_host_staging(size_t bytes, memory::Category category,
                                       memory::MemoryTracker& tracker) override {
    return inner_.allocate_host_staging(bytes, category, tracker);
  }
  memory::Stream& compute_stream() override { return inner_.compute_stream(); }
  std::unique_ptr<memory::Stream> create_stream(const std::string& name) override { return inner_.create_stream(name); }
  std::unique_ptr<memory::Event> create_event() override { return inner_.create_event(); }
  void record(memory::Event& event, memory::Stream& stream) override { inner_.record(event, stream); }
  void wait(memory::Stream& stream, const memory::Event& event) override { inner_.wait(stream, event); }
  void synchronize(const memory::Event& event, std::chrono::milliseconds timeout) override {
    ++host_waits_;
    inner_.synchronize(event, timeout);
  }
  void synchronize(memory::Stream& stream, std::chrono::milliseconds timeout) override {
    ++host_waits_;
    inner_.synchronize(stream, timeout);
  }
  void copy(void* dst, const void* src, size_t bytes, memory::Stream& stream) override {
    inner_.copy(dst, src, bytes, stream);
  }
  void fill_zero(void* dst, size_t bytes, memory::Stream& stream) override { inner_.fill_zero(dst, bytes, stream); }
  void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
               memory::Stream& stream) override {
    inner_.convert(src, src_dtype, dst, dst_dtype, n, stream);
  }
  void convert_rows(const void* src, DType src_dtype, size_t src_stride, void* dst, DType dst_dtype, size_t dst_stride,
                    size_t rows, size_t n, memory::Stream& stream) override {
    inner_.convert_rows(src, src_dtype, src_stride, dst, dst_dtype, dst_stride, rows, n, stream);
  }
  void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                  memory::Stream& stream) override {
    inner_.accumulate(dst, dst_dtype, src, src_dtype, n, stream);
  }
  void scale(void* x, DType dtype, size_t n, float factor, memory::Stream& stream) override {
    inner_.scale(x, dtype, n, factor, stream);
  }
  void ordered_sum(const void* ins, DType in_dtype, size_t stride, int k, void* out, DType out_dtype, size_t n,
                   memory::Stream& stream) override {
    inner_.ordered_sum(ins, in_dtype, stride, k, out, out_dtype, n, stream);
  }
  void block_sum_of_squares(const void* x, DType dtype, size_t block, size_t blocks, double* out,
                            memory::Stream& stream) override {
    inner_.block_sum_of_squares(x, dtype, block, blocks, out, stream);
  }
  void quantize_blocks(const void* src, DType src_dtype, size_t n, const memory::BlockQuantization& q, void* segment,
                       uint64_t* nonfinite, memory::Stream& stream) override {
    inner_.quantize_blocks(src, src_dtype, n, q, segment, nonfinite, stream);
  }
  void dequantize_rows(const void* segments, size_t segment_stride, size_t rows, size_t n,
                       const memory::BlockQuantization& q, void* dst, DType dst_dtype, size_t dst_stride,
                       memory::Stream& stream) override {
    inner_.dequantize_rows(segments, segment_stride, rows, n, q, dst, dst_dtype, dst_stride, stream);
  }
  void host_task(memory::Stream& stream, std::function<void()> fn) override { inner_.host_task(stream, std::move(fn)); }
  void* native_handle(memory::Stream& stream) override { return inner_.native_handle(stream); }

 private:
  memory::Device& inner_;
  std::atomic<int64_t> host_waits_{0}, allocations_{0};
};

class CountingCommunicator final : public comm::Communicator {
 public:
  explicit CountingCommunicator(comm::Communicator& inner)
      : inner_(inner), calls_(std::make_shared<std::atomic<int64_t>>(0)) {}

  // Calls issued over this communicator and every group split from it.
  int64_t calls() const { return calls_->load(); }
  // Bytes the all-gathers of `dtype` issued over it received (every rank's chunk, this rank's
  // included).
  int64_t all_gather_bytes(DType dtype) const { return gathered_[static_cast<size_t>(dtype)].load(); }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend_name() const override { return inner_.backend_name(); }
  std::chrono::milliseconds default_timeout() const override { return inner_.default_timeout(); }
  bool accepts(memory::DeviceKind kind) const override { return inner_.accepts(kind); }
  void set_issue_stream(void* stream) override { inner_.set_issue_stream(stream); }
  void set_call_label(std::string_view label) override { inner_.set_call_label(label); }
  void verify_schedule() override { inner_.verify_schedule(); }

  comm::WorkHandle all_reduce(void* buf, size_t count, DType dtype, comm::ReduceOp op) override {
    return issued(inner_.all_reduce(buf, count, dtype, op));
  }
  comm::WorkHandle reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                  comm::ReduceOp op) override {
    return issued(inner_.reduce_scatter(send, recv, recv_count, dtype, op));
  }
  comm::WorkHandle all_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    gathered_[static_cast<size_t>(dtype)] += static_cast<int64_t>(send_count * dtype_size(dtype)) * inner_.size();
    return issued(inner_.all_gather(send, recv, send_count, dtype));
  }
  comm::WorkHandle broadcast(void* buf, size_t count, DType dtype, int root) override {
    return issued(inner_.broadcast(buf, count, dtype, root));
  }
  comm::WorkHandle all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    return issued(inner_.all_to_all(send, recv, count, dtype));
  }
  comm::WorkHandle barrier() override { return issued(inner_.barrier()); }
  comm::WorkHandle send(const void* buf, size_t count, DType dtype, int peer) override {
    return issued(inner_.send(buf, count, dtype, peer));
  }
  comm::WorkHandle recv(void* buf, size_t count, DType dtype, int peer) override {
    return issued(inner_.recv(buf, count, dtype, peer));
  }
  std::unique_ptr<comm::Communicator> split(int color, int key) override {
    std::unique_ptr<comm::Communicator> child = inner_.split(color, key);
    if (child == nullptr) return nullptr;
    return std::unique_ptr<comm::Communicator>(new CountingCommunicator(std::move(child), calls_));
  }

 private:
  CountingCommunicator(std::unique_ptr<comm::Communicator> owned, std::shared_ptr<std::atomic<int64_t>> calls)
      : inner_(*owned), owned_(std::move(owned)), calls_(std::move(calls)) {}

  comm::WorkHandle issued(comm::WorkHandle w) {
    ++*calls_;
    return w;
  }

  comm::Communicator& inner_;
  std::unique_ptr<comm::Communicator> owned_;  // a split group's communicator
  std::shared_ptr<std::atomic<int64_t>> calls_;
  std::array<std::atomic<int64_t>, 8> gathered_{};  // this group's, indexed by DType (7 values)
};

}  // namespace zero::testing
