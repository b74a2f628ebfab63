#pragma once
// Collective schedule check: every collective a communicator issues gets a sequence number and a
// description (operation, dtype, element count, root, reduce op). In check mode each rank exchanges a
// 64-byte record of that description with every other rank right before the collective runs (one
// extra tiny exchange per call, on the same worker/stream as the collective, so it costs one network
// round trip whatever the message size). If any rank's record differs from rank 0's, every rank gets
// the same CommError naming both calls, e.g.
//   schedule mismatch: rank 0 called all_reduce(fp32, 1024, sum) #7 but rank 1 called
//   all_gather(fp32, 512) #7
// instead of a hang or silently mixed buffers. A call may carry the caller's label (what the call is
// for, e.g. "unit 3 forward"; Communicator::set_call_label): the label is part of what must agree,
// so two calls of the same shape made for different purposes are a mismatch too, and the message
// names each rank's purpose:
//   schedule mismatch: rank 0 called all_gather(fp32, 512) #7 [unit 3 forward] but rank 1 called
//   all_gather(fp32, 512) #7 [unit 4 forward]
// Point-to-point calls carry the same records, exchanged between the two ranks of a transfer only
// (find_p2p_mismatch): each send and its receive are numbered per (pair, direction), and a pair
// whose records differ fails on both ranks with one message naming both calls, e.g.
//   p2p mismatch: rank 0 called send(fp32, 100, to rank 1) #3 [stage 0 act] but rank 1 called
//   recv(fp32, 99, from rank 0) #3 [stage 0 act]
// Backend-neutral: the backends only move the records.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"
#include "comm/communicator.h"

namespace zero::comm {

enum class CollectiveKind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kAllToAll,
  kBarrier,
  // Point-to-point (not collectives, but checked with the same records): `root` is the peer.
  kSend,
  kRecv,
};
const char* collective_name(CollectiveKind kind);

// One issued collective as every rank must agree on it.
struct CallInfo {
  uint64_t seq = 0;  // 0-based issue index on the communicator
  CollectiveKind kind = CollectiveKind::kBarrier;
  DType dtype = DType::kUInt8;
  uint64_t count = 0;  // the count argument of the call (recv_count, send_count, ...)
  int32_t root = -1;   // broadcast: the root; send: the destination; recv: the source
  bool has_reduce_op = false;
  ReduceOp reduce_op = ReduceOp::kSum;  // all_reduce and reduce_scatter only
  std::string label;  // the caller's label, at most kCallLabelBytes bytes ("" when none)
};

// Longest label a record carries; longer labels are cut (at a UTF-8 character boundary).
constexpr size_t kCallLabelBytes = 32;
// `label` cut to kCallLabelBytes.
std::string fit_call_label(std::string_view label);

CallInfo make_call(uint64_t seq, CollectiveKind kind, DType dtype, uint64_t count);
CallInfo make_reduce_call(uint64_t seq, CollectiveKind kind, DType dtype, uint64_t count,
                          ReduceOp op);
CallInfo make_broadcast_call(uint64_t seq, DType dtype, uint64_t count, int root);
// kind kSend or kRecv; `seq` the transfer's number in its (pair, direction).
CallInfo make_p2p_call(uint64_t seq, CollectiveKind kind, DType dtype, uint64_t count, int peer);

// Hash (FNV-1a, 64 bit) of everything but the sequence number.
uint64_t call_hash(const CallInfo& call);
// "all_reduce(fp32, 1024, sum) #7", "broadcast(int64, 3, root 1) #2", "barrier() #0",
// "all_gather(fp32, 512) #7 [unit 3 forward]", "send(fp32, 100, to rank 1) #3",
// "recv(fp32, 100, from rank 0) #3".
std::string describe_call(const CallInfo& call);

constexpr size_t kCallRecordBytes = 32 + kCallLabelBytes;
using CallRecord = std::array<uint8_t, kCallRecordBytes>;

// Wire format: seq (8) | count (8) | hash (8) | kind, dtype, has_reduce_op, reduce_op (4) | root (4)
// | label (kCallLabelBytes, zero-padded), little endian (every supported host is).
CallRecord encode_call(const CallInfo& call);
// Throws CommError when the record is corrupt (its hash does not match its fields).
CallInfo decode_call(const CallRecord& record);

// Whether two ranks' calls agree: the same number, operation, dtype, count, root, reduce op (where
// the operation has one) and label.
bool same_call(const CallInfo& a, const CallInfo& b);

// Compares every rank's record (indexed by rank) with rank 0's. Returns "" when they all agree, else
// the mismatch message (the same text on every rank).
std::string find_schedule_mismatch(const std::vector<CallRecord>& records);

// Compares the record of a send (made by rank `sender`) with the record of the receive that is to
// match it (made by rank `receiver`). Returns "" when they agree (send and recv, same sequence
// number, dtype, count and label, each naming the other rank), else the mismatch message, the same
// on both ranks. Throws CommError when a record is corrupt.
std::string find_p2p_mismatch(const CallRecord& send, int sender, const CallRecord& recv,
                              int receiver);

// The ZERO_COMM_CHECK environment knob (1/0, true/false, ...), `fallback` when unset.
bool schedule_check_from_env(bool fallback);

}  // namespace zero::comm
