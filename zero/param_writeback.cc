#include "zero/param_writeback.h"

#include <algorithm>

#include "base/logging.h"

namespace zero {
namespace {

// Copies bucket b (its dtype, bucket-relative) into the tensors it overlaps.
void scatter_to_params(memory::Device& device, const WritebackTarget& t, size_t b, const void* bucket) {
  const auto& B = t.layout->buckets()[b];
  const size_t es = dtype_size(B.dtype);
  for (size_t i = B.first_tensor; i < B.end_tensor; ++i) {
    const auto& T = t.layout->tensors()[i];
    const size_t lo = std::max(T.offset, B.offset), hi = std::min(T.offset + T.numel, B.offset + B.numel);
    device.copy(static_cast<char*>(t.tensor_data[i]) + (lo - T.offset) * es,
                static_cast<const char*>(bucket) + (lo - B.offset) * es, (hi - lo) * es, device.compute_stream());
  }
}

// The owned range's place in a bucket-sized buffer.
void* in_bucket(const WritebackTarget& t, size_t b, void* buf, const OwnedRange& own) {
  const auto& B = t.layout->buckets()[b];
  return static_cast<char*>(buf) + (own.flat_begin - B.offset) * dtype_size(B.dtype);
}

memory::Buffer bucket_buffer(memory::Device& device, const WritebackTarget& t) {
  return device.allocate(t.layout->max_bucket_bytes(), memory::Category::kCommBuffer);
}

class LocalWriteback final : public ParamWriteback {
 public:
  LocalWriteback(memory::Device& device, WritebackTarget target)
      : device_(device), target_(std::move(target)), buf_(bucket_buffer(device, target_)) {}
  void* owned_out(size_t b, const OwnedRange& own) override { return in_bucket(target_, b, buf_.data(), own); }
  void publish(size_t b) override { scatter_to_params(device_, target_, b, buf_.data()); }
  void finish() override {}

 private:
  memory::Device& device_;
  WritebackTarget target_;
  memory::Buffer buf_;
};

class GatherWriteback final : public ParamWriteback {
 public:
  GatherWriteback(memory::Device& device, WritebackTarget target, comm::Communicator& comm,
                  std::chrono::milliseconds timeout, StepTimings* timings)
      : device_(device), target_(std::move(target)), comm_(comm), order_(device, comm, timeout), timings_(timings) {
    for (auto& s : slots_) s.buf = bucket_buffer(device, target_);
  }
  ~GatherWriteback() override {
    // An all-gather still in flight writes into our buffers: let it finish (or fail) first.
    for (auto& s : slots_) {
      try {
        if (s.work) s.work->wait();
      } catch (const std::exception& e) {
        ZERO_LOG_WARN("engine destroyed with a failed parameter all-gather in flight: {}", e.what());
      }
    }
  }

  void* owned_out(size_t b, const OwnedRange& own) override {
    Slot& s = slots_[b % 2];
    drain(s);  // the buffer's previous bucket must reach the parameters before reuse
    return in_bucket(target_, b, s.buf.data(), own);
  }
  void publish(size_t b) override {
    Slot& s = slots_[b % 2];
    const auto& B = target_.layout->buckets()[b];
    void* mine = static_cast<char*>(s.buf.data()) + static_cast<size_t>(comm_.rank()) * B.chunk * dtype_size(B.dtype);
    order_.before_issue(device_.compute_stream());
    s.work = comm_.all_gather(mine, s.buf.data(), B.chunk, B.dtype);
    s.bucket = b;
    if (timings_) timings_->gathered_bytes += target_.layout->bucket_bytes(b);
  }
  void finish() override {
    for (auto& s : slots_) drain(s);
  }

 private:
  struct Slot {
    memory::Buffer buf;
    comm::WorkHandle work;
    size_t bucket = 0;
  };
  void drain(Slot& s) {
    if (!s.work) return;
    {
      ScopedTimer waiting(timings_ ? &timings_->writeback_wait_s : nullptr);
      order_.after(*s.work, device_.compute_stream());
    }
    s.work.reset();
    scatter_to_params(device_, target_, s.bucket, s.buf.data());
  }

  memory::Device& device_;
  WritebackTarget target_;
  comm::Communicator& comm_;
  CollectiveOrder order_;
  StepTimings* timings_;
  std::array<Slot, 2> slots_;
};

class ShardWriteback final : public ParamWriteback {
 public:
  ShardWriteback(void* shard, const ShardLayout& layout) : shard_(static_cast<char*>(shard)), layout_(layout) {}
  void* owned_out(size_t b, const OwnedRange& own) override { return shard_ + layout_.shard_bytes(b, own.opt_begin); }
  void publish(size_t) override {}
  void finish() override {}

 private:
  char* shard_;
  const ShardLayout& layout_;
};

}  // namespace

std::unique_ptr<ParamWriteback> make_shard_writeback(void* shard, const ShardLayout& layout) {
  return std::make_unique<ShardWriteback>(shard, layout);
}

std::unique_ptr<ParamWriteback> make_local_writeback(memory::Device& device, WritebackTarget target) {
  return std::make_unique<LocalWriteback>(device, std::move(target));
}

std::unique_ptr<ParamWriteback> make_gather_writeback(memory::Device& device, WritebackTarget target,
                                                      comm::Communicator& shard_comm,
                                                      std::chrono::milliseconds timeout, StepTimings* timings) {
  return std::make_unique<GatherWriteback>(device, std::move(target), shard_comm, timeout, timings);
}

}  // namespace zero
