#include "comm/gloo/gloo_communicator.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gloo/context.h>

#include "base/check.h"
#include "base/logging.h"
#include "comm/gloo/failure_report.h"
#include "comm/gloo/gloo_call_runner.h"
#include "comm/gloo/gloo_collectives.h"
#include "comm/gloo/gloo_handshake.h"
#include "comm/gloo/gloo_p2p.h"
#include "comm/gloo/ordered_executor.h"
#include "comm/gloo/reduce_kernels.h"
#include "comm/schedule_check.h"

namespace zero::comm {
namespace {

// Where a peer's payload starts in its received message.
constexpr size_t kHeader = CallPlan::kHeader;

// Byte ranges [a, a + an) and [b, b + bn) intersect.
bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  if (an == 0 || bn == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

size_t checked_bytes(const char* op, const char* what, size_t count, size_t elem, size_t times) {
  const size_t max = std::numeric_limits<size_t>::max();
  if (elem != 0 && times != 0 && count > max / elem / times) {
    ZERO_THROW(InvalidArgument, "{}: {} of {} elements overflows the address space", op, what,
               count);
  }
  return count * elem * times;
}

void require_buffer(const char* op, const char* name, const void* p, size_t count) {
  if (p == nullptr && count > 0) {
    ZERO_THROW(InvalidArgument, "{}: {} is null with count {}", op, name, count);
  }
}

// The Communicator interface over Gloo: validates each call on the caller's thread and plans how it
// runs; the executor runs the plans in issue order, the runner runs each on the Gloo context.
class GlooCommunicator final : public Communicator, private OrderedExecutor::Owner {
 public:
  // `world_ranks`: a split communicator's members' ranks in the world (for its failure reports).
  GlooCommunicator(std::shared_ptr<Store> store, std::string prefix, int rank, int size,
                   GlooOptions options, bool check, std::vector<int> world_ranks = {})
      : store_(std::move(store)),
        prefix_(std::move(prefix)),
        world_ranks_(std::move(world_ranks)),
        rank_(rank),
        size_(size),
        options_(std::move(options)),
        check_(check),
        tap_(options_.traffic, world_ranks_),
        context_(connect_and_handshake(store_, prefix_, rank_, size_, options_, check_)),
        runner_(context_, options_, check_, &tap_),
        p2p_(context_, options_.timeout, check_, &tap_),
        executor_(options_.timeout, *this) {
    // A failed transfer fails the collectives too (and a failed collective the transfers:
    // failed()); the store carries why a rank closed its connections to the peer left behind.
    GlooP2P::Hooks hooks;
    hooks.failed = [this](const std::string& reason) { executor_.fail(reason); };
    hooks.note = [this](const std::string& reason) { failure_report_.note_p2p_failure(reason); };
    hooks.peer_note = [this](int peer) { return failure_report_.p2p_note(peer); };
    hooks.pending = store_exchange(store_, prefix_, rank_);
    p2p_.set_hooks(std::move(hooks));
  }

  // Queued work fails with "communicator destroyed". A collective still running is cut short
  // rather than left to run into its timeout (its peers may never come): its waits are woken and
  // the connections closed, so it fails at once and so do the peers' matching collectives. Pending
  // transfers are cut short the same way.
  ~GlooCommunicator() override {
    executor_.shutdown();
    p2p_.shutdown();
    runner_.bury();
  }

  int rank() const override { return rank_; }
  void set_call_label(std::string_view label) override {
    std::lock_guard<std::mutex> lock(mu_);
    call_label_ = fit_call_label(label);
  }
  int size() const override { return size_; }
  std::string backend_name() const override { return "gloo"; }
  std::chrono::milliseconds default_timeout() const override { return options_.timeout; }

  WorkHandle all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    const char* name = "all_reduce";
    const size_t es = dtype_size(dtype);
    checked_bytes(name, "buf", count, es, 1);
    require_buffer(name, "buf", buf, count);
    check_reduce_op(name, op);
    CallPlan plan;
    if (small(count * es)) {
      // Every rank sends its whole buffer to every peer and reduces all n in rank order.
      plan.payload = [=](int) { return Payload{buf, count * es}; };
      plan.apply = [=, this](const uint8_t* area, size_t stride) {
        std::vector<const void*> srcs(static_cast<size_t>(size_));
        for (int r = 0; r < size_; ++r) srcs[r] = r == rank_ ? buf : area + r * stride + kHeader;
        reduce_arrays(dtype, op, srcs.data(), srcs.size(), buf, count);
      };
    } else {
      plan.check_after_sends = true;
      plan.run = [=](gloo::Context& ctx, const DirectOptions& d, Scratch& scratch) {
        all_reduce_direct(ctx, buf, count, dtype, op, d, scratch);
      };
    }
    return enqueue(CollectiveKind::kAllReduce, dtype, count, op, -1, std::move(plan));
  }

  WorkHandle reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                            ReduceOp op) override {
    const char* name = "reduce_scatter";
    const size_t es = dtype_size(dtype);
    const size_t send_bytes = checked_bytes(name, "send", recv_count, es, size_);
    const size_t recv_bytes = recv_count * es;
    require_buffer(name, "send", send, recv_count);
    require_buffer(name, "recv", recv, recv_count);
    check_reduce_op(name, op);
    const auto* own = static_cast<const uint8_t*>(send) + rank_ * recv_bytes;
    if (recv != own && overlaps(send, send_bytes, recv, recv_bytes)) {
      ZERO_THROW(InvalidArgument,
                 "{}: recv overlaps send but is not the in-place position send + rank() * "
                 "recv_count (rank {}, recv_count {})",
                 name, rank_, recv_count);
    }
    CallPlan plan;
    if (small(recv_bytes)) {
      plan.payload = [=](int p) {
        return Payload{static_cast<const uint8_t*>(send) + p * recv_bytes, recv_bytes};
      };
      plan.apply = [=, this](const uint8_t* area, size_t stride) {
        std::vector<const void*> srcs(static_cast<size_t>(size_));
        for (int r = 0; r < size_; ++r) srcs[r] = r == rank_ ? own : area + r * stride + kHeader;
        reduce_arrays(dtype, op, srcs.data(), srcs.size(), recv, recv_count);
      };
    } else {
      plan.check_after_sends = true;
      plan.run = [=, this](gloo::Context& ctx, const DirectOptions& d, Scratch& scratch) {
        reduce_scatter_direct(ctx, send, recv, ChunkLayout::equal(size_, recv_count), dtype, op, d,
                              scratch);
      };
    }
    return enqueue(CollectiveKind::kReduceScatter, dtype, recv_count, op, -1, std::move(plan));
  }

  WorkHandle all_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    const char* name = "all_gather";
    const size_t es = dtype_size(dtype);
    const size_t recv_bytes = checked_bytes(name, "recv", send_count, es, size_);
    const size_t send_bytes = send_count * es;
    require_buffer(name, "send", send, send_count);
    require_buffer(name, "recv", recv, send_count);
    auto* own = static_cast<uint8_t*>(recv) + rank_ * send_bytes;
    if (send != own && overlaps(send, send_bytes, recv, recv_bytes)) {
      ZERO_THROW(InvalidArgument,
                 "{}: send overlaps recv but is not the in-place position recv + rank() * "
                 "send_count (rank {}, send_count {})",
                 name, rank_, send_count);
    }
    CallPlan plan;
    if (small(send_bytes)) {
      plan.payload = [=](int) { return Payload{send, send_bytes}; };
      plan.apply = [=, this](const uint8_t* area, size_t stride) {
        for (int r = 0; r < size_; ++r) {
          uint8_t* to = static_cast<uint8_t*>(recv) + r * send_bytes;
          if (r != rank_) {
            std::memcpy(to, area + r * stride + kHeader, send_bytes);
          } else if (send != own && send_bytes > 0) {
            std::memcpy(own, send, send_bytes);
          }
        }
      };
    } else {
      plan.check_after_sends = true;
      plan.run = [=, this](gloo::Context& ctx, const DirectOptions& d, Scratch&) {
        if (send != own && send_bytes > 0) std::memcpy(own, send, send_bytes);
        all_gather_direct(ctx, recv, ChunkLayout::equal(size_, send_count), es, d);
      };
    }
    return enqueue(CollectiveKind::kAllGather, dtype, send_count, std::nullopt, -1,
                   std::move(plan));
  }

  WorkHandle broadcast(void* buf, size_t count, DType dtype, int root) override {
    const char* name = "broadcast";
    const size_t bytes = checked_bytes(name, "buf", count, dtype_size(dtype), 1);
    require_buffer(name, "buf", buf, count);
    if (root < 0 || root >= size_) {
      ZERO_THROW(InvalidArgument, "{}: root {} is out of range [0, {})", name, root, size_);
    }
    CallPlan plan;
    if (small(bytes)) {
      plan.payload = [=, this](int) {
        return rank_ == root ? Payload{buf, bytes} : Payload{};
      };
      plan.apply = [=, this](const uint8_t* area, size_t stride) {
        if (rank_ != root && bytes > 0) std::memcpy(buf, area + root * stride + kHeader, bytes);
      };
    } else {
      plan.run = [=](gloo::Context& ctx, const DirectOptions& d, Scratch&) {
        broadcast_direct(ctx, buf, bytes, root, d);
      };
    }
    return enqueue(CollectiveKind::kBroadcast, dtype, count, std::nullopt, root, std::move(plan));
  }

  WorkHandle all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    const char* name = "all_to_all";
    const size_t bytes = checked_bytes(name, "send", count, dtype_size(dtype), size_);
    require_buffer(name, "send", send, count);
    require_buffer(name, "recv", recv, count);
    if (overlaps(send, bytes, recv, bytes)) {
      ZERO_THROW(InvalidArgument, "{}: send and recv overlap (all_to_all is not in place)", name);
    }
    const size_t chunk = count * dtype_size(dtype);
    CallPlan plan;
    if (small(chunk)) {
      plan.payload = [=](int p) {
        return Payload{static_cast<const uint8_t*>(send) + p * chunk, chunk};
      };
      plan.apply = [=, this](const uint8_t* area, size_t stride) {
        for (int r = 0; r < size_ && chunk > 0; ++r) {
          const uint8_t* from = r == rank_ ? static_cast<const uint8_t*>(send) + r * chunk
                                           : area + r * stride + kHeader;
          std::memcpy(static_cast<uint8_t*>(recv) + r * chunk, from, chunk);
        }
      };
    } else {
      plan.run = [=](gloo::Context& ctx, const DirectOptions& d, Scratch&) {
        all_to_all_direct(ctx, send, recv, chunk, d);
      };
    }
    return enqueue(CollectiveKind::kAllToAll, dtype, count, std::nullopt, -1, std::move(plan));
  }

  WorkHandle barrier() override {
    // The message round itself is the barrier: nobody finishes before everybody's header arrived.
    CallPlan plan;
    plan.payload = [](int) { return Payload{}; };
    plan.apply = [](const uint8_t*, size_t) {};
    return enqueue(CollectiveKind::kBarrier, DType::kUInt8, 0, std::nullopt, -1, std::move(plan));
  }

  WorkHandle send(const void* buf, size_t count, DType dtype, int peer) override {
    check_transfer("send", buf, count, dtype, peer);
    return p2p_.send(buf, count, dtype, peer, label());
  }

  WorkHandle recv(void* buf, size_t count, DType dtype, int peer) override {
    check_transfer("recv", buf, count, dtype, peer);
    return p2p_.recv(buf, count, dtype, peer, label());
  }

  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  void check_transfer(const char* name, const void* buf, size_t count, DType dtype, int peer) const {
    const size_t bytes = check_p2p_args(name, buf, count, dtype, peer, rank_, size_);
    if (bytes > kMaxTransferBytes) {
      ZERO_THROW(InvalidArgument, "{}: buf of {} bytes exceeds the {} bytes one Gloo transfer can carry",
                 name, bytes, kMaxTransferBytes);
    }
  }

  std::string label() {
    std::lock_guard<std::mutex> lock(mu_);
    return call_label_;
  }

  bool small(size_t payload_bytes) const { return runs_as_messages(options_, payload_bytes); }

  static void check_reduce_op(const char* name, ReduceOp op) {
    if (static_cast<int>(op) < 0 || static_cast<int>(op) > static_cast<int>(ReduceOp::kMin)) {
      ZERO_THROW(InvalidArgument, "{}: unknown reduce op value {}", name, static_cast<int>(op));
    }
  }

  WorkHandle enqueue(CollectiveKind kind, DType dtype, size_t count, std::optional<ReduceOp> op,
                     int root, CallPlan plan) {
    std::string label = this->label();
    return executor_.submit([&](uint64_t seq) {
      CallInfo call = op ? make_reduce_call(seq, kind, dtype, count, *op)
                         : make_call(seq, kind, dtype, count);
      call.root = root;
      call.label = std::move(label);
      OrderedExecutor::Operation operation;
      operation.what = fmt::format("gloo rank {}: {}", rank_, describe_call(call));
      operation.run = [this, call = std::move(call), plan = std::move(plan)](const std::string& what) {
        return run_call(call, plan, what);
      };
      return operation;
    });
  }

  // Runs a call (on the executor's worker or a waiting caller); a failure's message gets which
  // ranks never reached it, and is logged.
  OpResult run_call(const CallInfo& call, const CallPlan& plan, const std::string& what) {
    OpResult result = runner_.run(call, plan, what);
    if (result.outcome != Outcome::kOk) {
      result.message += absent_ranks(call.seq);
      ZERO_LOG_ERROR("{}", result.message);
    }
    return result;
  }

  // OrderedExecutor::Owner: a caller gave up on a call, or the communicator is destroyed while one
  // runs.
  void cut_short(const std::string& reason) override { runner_.cut_short(reason); }
  // The executor failed (a collective failed or was given up on): so do the transfers.
  void failed(const std::string& reason) override { p2p_.fail(reason); }
  std::string abandoned_note(uint64_t seq) override { return absent_ranks(seq); }

  // Which ranks never reached collective `seq`, for the failure's message (failure_report.h).
  std::string absent_ranks(uint64_t seq) { return failure_report_.absent_ranks(seq, runner_.awaited_peer()); }

  std::shared_ptr<Store> store_;
  const std::string prefix_;  // unique to this communicator instance
  const std::vector<int> world_ranks_;  // a split one's members' ranks in the world; empty: the world
  const int rank_;
  const int size_;
  const GlooOptions options_;
  const bool check_;
  const FailureReport failure_report_{store_, prefix_, rank_, size_, options_.failure_report_grace, world_ranks_};
  const TrafficTap tap_;  // the bytes sent to each peer, into options_.traffic
  const std::shared_ptr<gloo::Context> context_;  // shared by the collectives and the transfers
  GlooCallRunner runner_;
  GlooP2P p2p_;

  std::mutex mu_;
  std::string call_label_;  // set_call_label; guarded by mu_
  uint64_t splits_ = 0;     // guarded by mu_

  // Last: its worker starts once the ranks have met, and calls into the members above.
  OrderedExecutor executor_;
};

Bytes encode_color_key(int color, int key) {
  Bytes b(8);
  std::memcpy(b.data(), &color, 4);
  std::memcpy(b.data() + 4, &key, 4);
  return b;
}

std::unique_ptr<Communicator> GlooCommunicator::split(int color, int key) {
  uint64_t index;
  {
    std::lock_guard<std::mutex> lock(mu_);
    index = splits_++;
  }
  const std::string base = fmt::format("{}/split{}", prefix_, index);
  store_->set(fmt::format("{}/{}", base, rank_), encode_color_key(color, key));
  std::vector<std::tuple<int, int>> members;  // (key, rank) of ranks with my color
  for (int r = 0; r < size_; ++r) {
    const Bytes b = store_->get(fmt::format("{}/{}", base, r), options_.timeout);
    if (b.size() != 8) {
      ZERO_THROW(CommError, "gloo rank {}: split record of rank {} has {} bytes", rank_, r,
                 b.size());
    }
    int c, k;
    std::memcpy(&c, b.data(), 4);
    std::memcpy(&k, b.data() + 4, 4);
    if (c == color) members.emplace_back(k, r);
  }
  if (color < 0) return nullptr;
  std::sort(members.begin(), members.end());
  int new_rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (std::get<1>(members[i]) == rank_) new_rank = static_cast<int>(i);
  }
  ZERO_CHECK_GE(new_rank, 0, "own rank missing from its split group");
  std::vector<int> world;  // the members' ranks in the world, for their failure reports
  for (const auto& [k, r] : members) world.push_back(world_ranks_.empty() ? r : world_ranks_[static_cast<size_t>(r)]);
  return std::make_unique<GlooCommunicator>(store_, fmt::format("{}/color{}", base, color),
                                            new_rank, static_cast<int>(members.size()), options_,
                                            check_, std::move(world));
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Store> store, int rank,
                                                     int size, const GlooOptions& options) {
  options.validate();
  if (!store) ZERO_THROW(InvalidArgument, "make_gloo_communicator: store is null");
  if (size < 1) ZERO_THROW(InvalidArgument, "make_gloo_communicator: size {} < 1", size);
  if (rank < 0 || rank >= size) {
    ZERO_THROW(InvalidArgument, "make_gloo_communicator: rank {} is out of range [0, {})", rank,
               size);
  }
  if (options.traffic && options.traffic->world_size() != size) {
    ZERO_THROW(InvalidArgument, "make_gloo_communicator: GlooOptions.traffic counts a world of {} ranks, the "
               "communicator has {}", options.traffic->world_size(), size);
  }
  const bool check = options.check_schedule && schedule_check_from_env(true);
  // Every rank creates its communicators in the same order, so the per-rank instance counter gives
  // all ranks the same fresh prefix even when the store already holds an older group's keys.
  const int64_t instance = store->add(fmt::format("{}/instances/{}", options.prefix, rank), 1);
  return std::make_unique<GlooCommunicator>(
      store, fmt::format("{}/{}", options.prefix, instance), rank, size, options, check);
}

}  // namespace zero::comm
