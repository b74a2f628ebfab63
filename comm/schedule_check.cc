#include "comm/schedule_check.h"

#include <fmt/format.h>

#include <cstring>

#include "base/check.h"
#include "base/env.h"

namespace zero::comm {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kAllToAll: return "all_to_all";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kSend: return "send";
    case CollectiveKind::kRecv: return "recv";
  }
  return "unknown";
}

std::string fit_call_label(std::string_view label) {
  if (label.size() <= kCallLabelBytes) return std::string(label);
  size_t n = kCallLabelBytes;
  // Never cut inside a UTF-8 sequence: back up over continuation bytes (10xxxxxx).
  while (n > 0 && (static_cast<uint8_t>(label[n]) & 0xC0) == 0x80) --n;
  return std::string(label.substr(0, n));
}

CallInfo make_call(uint64_t seq, CollectiveKind kind, DType dtype, uint64_t count) {
  CallInfo c;
  c.seq = seq;
  c.kind = kind;
  c.dtype = dtype;
  c.count = count;
  return c;
}

CallInfo make_reduce_call(uint64_t seq, CollectiveKind kind, DType dtype, uint64_t count,
                          ReduceOp op) {
  CallInfo c = make_call(seq, kind, dtype, count);
  c.has_reduce_op = true;
  c.reduce_op = op;
  return c;
}

CallInfo make_broadcast_call(uint64_t seq, DType dtype, uint64_t count, int root) {
  CallInfo c = make_call(seq, CollectiveKind::kBroadcast, dtype, count);
  c.root = root;
  return c;
}

CallInfo make_p2p_call(uint64_t seq, CollectiveKind kind, DType dtype, uint64_t count, int peer) {
  ZERO_CHECK(kind == CollectiveKind::kSend || kind == CollectiveKind::kRecv,
             "make_p2p_call: {} is not a point-to-point call", collective_name(kind));
  CallInfo c = make_call(seq, kind, dtype, count);
  c.root = peer;
  return c;
}

namespace {

void fnv_bytes(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
}

template <typename T>
void put(CallRecord& r, size_t offset, T v) {
  std::memcpy(r.data() + offset, &v, sizeof v);
}

template <typename T>
T take(const CallRecord& r, size_t offset) {
  T v;
  std::memcpy(&v, r.data() + offset, sizeof v);
  return v;
}

}  // namespace

uint64_t call_hash(const CallInfo& call) {
  uint64_t h = 0xcbf29ce484222325ull;
  const uint8_t small[4] = {static_cast<uint8_t>(call.kind), static_cast<uint8_t>(call.dtype),
                            static_cast<uint8_t>(call.has_reduce_op),
                            static_cast<uint8_t>(call.has_reduce_op ? call.reduce_op
                                                                    : ReduceOp::kSum)};
  fnv_bytes(h, small, sizeof small);
  fnv_bytes(h, &call.count, sizeof call.count);
  fnv_bytes(h, &call.root, sizeof call.root);
  fnv_bytes(h, call.label.data(), call.label.size());
  return h;
}

std::string describe_call(const CallInfo& call) {
  std::string args;
  switch (call.kind) {
    case CollectiveKind::kBarrier: break;
    case CollectiveKind::kBroadcast:
      args = fmt::format("{}, {}, root {}", dtype_name(call.dtype), call.count, call.root);
      break;
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv:
      args = fmt::format("{}, {}, {} rank {}", dtype_name(call.dtype), call.count,
                         call.kind == CollectiveKind::kSend ? "to" : "from", call.root);
      break;
    default:
      args = fmt::format("{}, {}", dtype_name(call.dtype), call.count);
      if (call.has_reduce_op) args += fmt::format(", {}", reduce_op_name(call.reduce_op));
      break;
  }
  std::string text = fmt::format("{}({}) #{}", collective_name(call.kind), args, call.seq);
  if (!call.label.empty()) text += fmt::format(" [{}]", call.label);
  return text;
}

CallRecord encode_call(const CallInfo& call) {
  CallRecord r{};
  put<uint64_t>(r, 0, call.seq);
  put<uint64_t>(r, 8, call.count);
  put<uint64_t>(r, 16, call_hash(call));
  r[24] = static_cast<uint8_t>(call.kind);
  r[25] = static_cast<uint8_t>(call.dtype);
  r[26] = static_cast<uint8_t>(call.has_reduce_op);
  r[27] = static_cast<uint8_t>(call.reduce_op);
  put<int32_t>(r, 28, call.root);
  ZERO_CHECK_LE(call.label.size(), kCallLabelBytes, "call label too long (fit_call_label cuts it)");
  std::memcpy(r.data() + 32, call.label.data(), call.label.size());
  return r;
}

CallInfo decode_call(const CallRecord& record) {
  CallInfo c;
  c.seq = take<uint64_t>(record, 0);
  c.count = take<uint64_t>(record, 8);
  const auto hash = take<uint64_t>(record, 16);
  if (record[24] > static_cast<uint8_t>(CollectiveKind::kRecv) ||
      record[25] > static_cast<uint8_t>(DType::kUInt8) || record[26] > 1 ||
      record[27] > static_cast<uint8_t>(ReduceOp::kMin)) {
    ZERO_THROW(CommError, "schedule check: corrupt call record (field out of range)");
  }
  c.kind = static_cast<CollectiveKind>(record[24]);
  c.dtype = static_cast<DType>(record[25]);
  c.has_reduce_op = record[26] != 0;
  c.reduce_op = static_cast<ReduceOp>(record[27]);
  c.root = take<int32_t>(record, 28);
  const auto* label = reinterpret_cast<const char*>(record.data() + 32);
  c.label.assign(label, strnlen(label, kCallLabelBytes));
  if (call_hash(c) != hash) {
    ZERO_THROW(CommError, "schedule check: corrupt call record (hash mismatch for {})",
               describe_call(c));
  }
  return c;
}

bool same_call(const CallInfo& a, const CallInfo& b) {
  return a.seq == b.seq && a.kind == b.kind && a.dtype == b.dtype && a.count == b.count && a.root == b.root &&
         a.has_reduce_op == b.has_reduce_op && (!a.has_reduce_op || a.reduce_op == b.reduce_op) && a.label == b.label;
}

std::string find_schedule_mismatch(const std::vector<CallRecord>& records) {
  ZERO_CHECK(!records.empty(), "no records to compare");
  const CallInfo first = decode_call(records[0]);
  for (size_t r = 1; r < records.size(); ++r) {
    const CallInfo other = decode_call(records[r]);
    if (!same_call(first, other)) {
      return fmt::format("schedule mismatch: rank 0 called {} but rank {} called {}",
                         describe_call(first), r, describe_call(other));
    }
  }
  return {};
}

std::string find_p2p_mismatch(const CallRecord& send, int sender, const CallRecord& recv,
                              int receiver) {
  const CallInfo s = decode_call(send);
  const CallInfo r = decode_call(recv);
  const bool same = s.kind == CollectiveKind::kSend && r.kind == CollectiveKind::kRecv &&
                    s.seq == r.seq && s.dtype == r.dtype && s.count == r.count &&
                    s.root == receiver && r.root == sender && s.label == r.label;
  if (same) return {};
  return fmt::format("p2p mismatch: rank {} called {} but rank {} called {}", sender,
                     describe_call(s), receiver, describe_call(r));
}

bool schedule_check_from_env(bool fallback) { return env_bool("ZERO_COMM_CHECK", fallback); }

}  // namespace zero::comm
