#include "comm/planning_communicator.h"

#include <algorithm>

#include <cstring>

#include "base/check.h"

namespace zero::comm {
namespace {

class DoneWork final : public Work {
 public:
  void wait(std::chrono::milliseconds) override {}
  void wait() override {}
  bool is_completed() override { return true; }
  void wait_stream(void*) override {}
};

WorkHandle done() { return std::make_shared<DoneWork>(); }

template <typename T>
void multiply(void* buf, size_t count, int factor) {
  T* x = static_cast<T*>(buf);
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<T>(x[i] * static_cast<T>(factor));
}

// What a sum over `ranks` identical contributions gives, where the dtype has plain arithmetic; 16-bit
// and byte values are left as they are (the engine agrees on none of them by sum).
void sum_of_identical(void* buf, size_t count, DType dtype, int ranks) {
  switch (dtype) {
    case DType::kFloat32: multiply<float>(buf, count, ranks); break;
    case DType::kFloat64: multiply<double>(buf, count, ranks); break;
    case DType::kInt32: multiply<int32_t>(buf, count, ranks); break;
    case DType::kInt64: multiply<int64_t>(buf, count, ranks); break;
    default: break;
  }
}

}  // namespace

PlanningCommunicator::PlanningCommunicator(int rank, int size, Addressable addressable, memory::DeviceKind accepts)
    : rank_(rank), size_(size), addressable_(std::move(addressable)), accepts_(accepts) {
  ZERO_CHECK(size >= 1 && rank >= 0 && rank < size, "planning communicator: rank {} of {}", rank, size);
  ZERO_CHECK(addressable_ != nullptr, "planning communicator: no addressability test");
}

void PlanningCommunicator::count(CollectiveKind kind, size_t count, DType dtype, uint64_t payload, uint64_t wire) {
  calls_.push_back({kind, count, dtype});
  for (auto* m : {&tallies_, parent_tally_.get()}) {
    if (m == nullptr) continue;
    CollectiveTally& t = (*m)[collective_name(kind)];
    ++t.calls;
    t.payload_bytes += payload;
    t.wire_bytes += wire;
  }
}

WorkHandle PlanningCommunicator::all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  const uint64_t bytes = count * dtype_size(dtype);
  this->count(CollectiveKind::kAllReduce, count, dtype, bytes, 2 * bytes * static_cast<uint64_t>(size_ - 1) / static_cast<uint64_t>(size_));
  if (op == ReduceOp::kSum && real(buf, bytes)) sum_of_identical(buf, count, dtype, size_);
  if (op == ReduceOp::kMax && dtype == DType::kInt64 && peer_int64_max_ && size_ > 1 && real(buf, bytes)) {
    auto* v = static_cast<int64_t*>(buf);
    for (size_t i = 0; i < count; ++i) v[i] = std::max(v[i], *peer_int64_max_);
  }
  return done();
}

WorkHandle PlanningCommunicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                                ReduceOp op) {
  const uint64_t chunk = recv_count * dtype_size(dtype), total = chunk * static_cast<uint64_t>(size_);
  count(CollectiveKind::kReduceScatter, recv_count, dtype, total, chunk * static_cast<uint64_t>(size_ - 1));
  const char* mine = static_cast<const char*>(send) + chunk * static_cast<uint64_t>(rank_);
  if (real(mine, chunk) && real(recv, chunk)) {
    if (recv != mine) std::memmove(recv, mine, chunk);
    if (op == ReduceOp::kSum) sum_of_identical(recv, recv_count, dtype, size_);
  }
  return done();
}

WorkHandle PlanningCommunicator::all_gather(const void* send, void* recv, size_t send_count, DType dtype) {
  const uint64_t chunk = send_count * dtype_size(dtype), total = chunk * static_cast<uint64_t>(size_);
  count(CollectiveKind::kAllGather, send_count, dtype, total, chunk * static_cast<uint64_t>(size_ - 1));
  if (real(send, chunk) && real(recv, total)) {
    auto* out = static_cast<char*>(recv);
    const char* src = static_cast<const char*>(send);
    for (int r = 0; r < size_; ++r) {
      char* dst = out + chunk * static_cast<uint64_t>(r);
      if (dst != src) std::memmove(dst, src, chunk);
    }
  }
  return done();
}

WorkHandle PlanningCommunicator::broadcast(void*, size_t count, DType dtype, int root) {
  ZERO_CHECK(root >= 0 && root < size_, "broadcast root {} of {} ranks", root, size_);
  const uint64_t bytes = count * dtype_size(dtype);
  this->count(CollectiveKind::kBroadcast, count, dtype, bytes, bytes);
  return done();  // every rank holds the same values already
}

WorkHandle PlanningCommunicator::all_to_all(const void* send, void* recv, size_t count, DType dtype) {
  const uint64_t chunk = count * dtype_size(dtype), total = chunk * static_cast<uint64_t>(size_);
  this->count(CollectiveKind::kAllToAll, count, dtype, total, chunk * static_cast<uint64_t>(size_ - 1));
  // Rank r's chunk `rank` is this rank's own chunk `rank`: every received chunk is that one.
  const char* mine = static_cast<const char*>(send) + chunk * static_cast<uint64_t>(rank_);
  if (real(mine, chunk) && real(recv, total)) {
    for (int r = 0; r < size_; ++r) std::memcpy(static_cast<char*>(recv) + chunk * static_cast<uint64_t>(r), mine, chunk);
  }
  return done();
}

WorkHandle PlanningCommunicator::barrier() {
  count(CollectiveKind::kBarrier, 0, DType::kUInt8, 0, 0);
  return done();
}

WorkHandle PlanningCommunicator::send(const void* buf, size_t count, DType dtype, int peer) {
  const size_t bytes = check_p2p_args("send", buf, count, dtype, peer, rank_, size_);
  P2PTally& t = p2p_tallies_[peer];
  ++t.sends;
  t.bytes_sent += bytes;
  return done();
}

WorkHandle PlanningCommunicator::recv(void* buf, size_t count, DType dtype, int peer) {
  const size_t bytes = check_p2p_args("recv", buf, count, dtype, peer, rank_, size_);
  P2PTally& t = p2p_tallies_[peer];
  ++t.recvs;
  t.bytes_received += bytes;
  return done();  // the buffer keeps what it held: no peer exists to fill it
}

std::unique_ptr<Communicator> PlanningCommunicator::split(int color, int) {
  const size_t i = split_tallies_.size();
  if (i >= planned_splits_.size()) {
    ZERO_THROW(InvalidArgument, "a plan covers the communicators it was told of: split() number {} was not planned "
               "(PlanningCommunicator::plan_splits)", i + 1);
  }
  split_tallies_.push_back(std::make_shared<std::map<std::string, CollectiveTally>>());
  if (color < 0) return nullptr;
  const PlannedSplit& s = planned_splits_[i];
  auto child = std::make_unique<PlanningCommunicator>(s.rank, s.size, addressable_, accepts_);
  child->parent_tally_ = split_tallies_.back();
  return child;
}

}  // namespace zero::comm
