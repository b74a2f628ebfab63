#include "comm/store/store_wire.h"

#include <fmt/format.h>

#include <cstring>

namespace zero::comm::wire {
namespace {

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void bytes(const uint8_t* data, size_t n, size_t limit, const char* what) {
    // Encoding checks the caller's input (a key or value too large): InvalidArgument.
    if (n > limit) {
      throw InvalidArgument(fmt::format("store {} of {} bytes is over the limit of {}", what, n, limit));
    }
    u32(static_cast<uint32_t>(n));
    out_.insert(out_.end(), data, data + n);
  }
  void str(const std::string& s, size_t limit, const char* what) {
    bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size(), limit, what);
  }
  void bytes(const Bytes& b, size_t limit, const char* what) {
    bytes(b.data(), b.size(), limit, what);
  }
  Bytes take() { return std::move(out_); }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  Bytes out_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t u8() { return static_cast<uint8_t>(get(1)); }
  uint16_t u16() { return static_cast<uint16_t>(get(2)); }
  uint32_t u32() { return static_cast<uint32_t>(get(4)); }
  uint64_t u64() { return get(8); }
  Bytes bytes(size_t limit, const char* what) {
    const size_t n = length(limit, what);
    Bytes out(p_, p_ + n);
    p_ += n;
    return out;
  }
  std::string str(size_t limit, const char* what) {
    const size_t n = length(limit, what);
    std::string out(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return out;
  }
  std::vector<std::string> keys() {
    const uint32_t n = u32();
    if (n > kMaxKeys) throw ProtocolError(fmt::format("malformed store message: {} keys (max {})", n, kMaxKeys));
    std::vector<std::string> out;
    out.reserve(n);
    for (uint32_t i = 0; i < n; ++i) out.push_back(str(kMaxKeyBytes, "key"));
    return out;
  }
  void finish() const {
    if (p_ != end_) {
      throw ProtocolError(fmt::format("malformed store message: {} trailing bytes", end_ - p_));
    }
  }

 private:
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  uint64_t get(int n) {
    if (remaining() < static_cast<size_t>(n)) throw ProtocolError("malformed store message: truncated");
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p_[i]) << (8 * i);
    p_ += n;
    return v;
  }
  size_t length(size_t limit, const char* what) {
    const uint32_t n = u32();
    if (n > limit) {
      throw ProtocolError(fmt::format("malformed store message: {} of {} bytes (max {})", what, n, limit));
    }
    if (n > remaining()) throw ProtocolError("malformed store message: truncated");
    return n;
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

void write_keys(Writer& w, const std::vector<std::string>& keys) {
  if (keys.size() > kMaxKeys) {
    throw InvalidArgument(fmt::format("store request with {} keys (max {})", keys.size(), kMaxKeys));
  }
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k, kMaxKeyBytes, "key");
}

bool single_key(Op op) { return op != Op::kCheck && op != Op::kWait; }

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::kSet: return "set";
    case Op::kGet: return "get";
    case Op::kAdd: return "add";
    case Op::kCompareSet: return "compare_set";
    case Op::kDelete: return "delete_key";
    case Op::kCheck: return "check";
    case Op::kWait: return "wait";
  }
  return "unknown";
}

Bytes encode_hello(const std::string& token) {
  if (token.size() > kMaxTokenBytes) {
    throw InvalidArgument(fmt::format("job token of {} bytes is over the limit of {}", token.size(), kMaxTokenBytes));
  }
  Writer w;
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(static_cast<uint16_t>(token.size()));
  Bytes out = w.take();
  out.insert(out.end(), token.begin(), token.end());
  return out;
}

HelloHeader decode_hello_header(const uint8_t* data) {
  Reader r(data, kHelloFixedBytes);
  HelloHeader h;
  h.magic = r.u32();
  h.version = r.u16();
  h.token_bytes = r.u16();
  return h;
}

Bytes encode_hello_reply(HelloStatus status, const std::string& message) {
  Writer w;
  w.u8(static_cast<uint8_t>(status));
  w.str(message.substr(0, kMaxMessageBytes), kMaxMessageBytes, "message");
  return w.take();
}

void decode_hello_reply(const uint8_t* data, size_t size, HelloStatus* status, std::string* message) {
  Reader r(data, size);
  const uint8_t s = r.u8();
  if (s > static_cast<uint8_t>(HelloStatus::kBadToken)) {
    throw ProtocolError(fmt::format("malformed store hello reply: status {}", s));
  }
  *status = static_cast<HelloStatus>(s);
  *message = r.str(kMaxMessageBytes, "message");
  r.finish();
}

Bytes encode_request(const Request& req) {
  Writer w;
  w.u8(static_cast<uint8_t>(req.op));
  if (single_key(req.op) && req.keys.size() != 1) {
    throw InvalidArgument(fmt::format("store {} request needs exactly one key, got {}", op_name(req.op), req.keys.size()));
  }
  switch (req.op) {
    case Op::kSet:
      w.str(req.keys[0], kMaxKeyBytes, "key");
      w.bytes(req.value, kMaxValueBytes, "value");
      break;
    case Op::kGet:
      w.str(req.keys[0], kMaxKeyBytes, "key");
      w.u64(req.timeout_ms);
      break;
    case Op::kAdd:
      w.str(req.keys[0], kMaxKeyBytes, "key");
      w.u64(static_cast<uint64_t>(req.delta));
      break;
    case Op::kCompareSet:
      w.str(req.keys[0], kMaxKeyBytes, "key");
      w.bytes(req.value, kMaxValueBytes, "value");
      w.bytes(req.desired, kMaxValueBytes, "value");
      break;
    case Op::kDelete:
      w.str(req.keys[0], kMaxKeyBytes, "key");
      break;
    case Op::kCheck:
      write_keys(w, req.keys);
      break;
    case Op::kWait:
      write_keys(w, req.keys);
      w.u64(req.timeout_ms);
      break;
  }
  return w.take();
}

Request decode_request(const uint8_t* data, size_t size) {
  Reader r(data, size);
  Request req;
  const uint8_t op = r.u8();
  if (op < static_cast<uint8_t>(Op::kSet) || op > static_cast<uint8_t>(Op::kWait)) {
    throw ProtocolError(fmt::format("malformed store message: unknown op {}", op));
  }
  req.op = static_cast<Op>(op);
  if (single_key(req.op)) req.keys.push_back(r.str(kMaxKeyBytes, "key"));
  switch (req.op) {
    case Op::kSet: req.value = r.bytes(kMaxValueBytes, "value"); break;
    case Op::kGet: req.timeout_ms = r.u64(); break;
    case Op::kAdd: req.delta = static_cast<int64_t>(r.u64()); break;
    case Op::kCompareSet:
      req.value = r.bytes(kMaxValueBytes, "value");
      req.desired = r.bytes(kMaxValueBytes, "value");
      break;
    case Op::kDelete: break;
    case Op::kCheck: req.keys = r.keys(); break;
    case Op::kWait:
      req.keys = r.keys();
      req.timeout_ms = r.u64();
      break;
  }
  r.finish();
  return req;
}

Bytes encode_response(Op op, const Response& resp) {
  Writer w;
  w.u8(static_cast<uint8_t>(resp.status));
  switch (resp.status) {
    case Status::kOk:
      switch (op) {
        case Op::kGet:
        case Op::kCompareSet: w.bytes(resp.value, kMaxValueBytes, "value"); break;
        case Op::kAdd: w.u64(static_cast<uint64_t>(resp.number)); break;
        case Op::kDelete:
        case Op::kCheck: w.u8(resp.flag ? 1 : 0); break;
        case Op::kSet:
        case Op::kWait: break;
      }
      break;
    case Status::kTimeout: write_keys(w, resp.missing); break;
    case Status::kInvalid:
    case Status::kError: w.str(resp.message.substr(0, kMaxMessageBytes), kMaxMessageBytes, "message"); break;
  }
  return w.take();
}

Response decode_response(Op op, const uint8_t* data, size_t size) {
  Reader r(data, size);
  Response resp;
  const uint8_t status = r.u8();
  if (status > static_cast<uint8_t>(Status::kError)) {
    throw ProtocolError(fmt::format("malformed store reply: status {}", status));
  }
  resp.status = static_cast<Status>(status);
  switch (resp.status) {
    case Status::kOk:
      switch (op) {
        case Op::kGet:
        case Op::kCompareSet: resp.value = r.bytes(kMaxValueBytes, "value"); break;
        case Op::kAdd: resp.number = static_cast<int64_t>(r.u64()); break;
        case Op::kDelete:
        case Op::kCheck: {
          const uint8_t f = r.u8();
          if (f > 1) throw ProtocolError(fmt::format("malformed store reply: flag {}", f));
          resp.flag = f == 1;
          break;
        }
        case Op::kSet:
        case Op::kWait: break;
      }
      break;
    case Status::kTimeout: resp.missing = r.keys(); break;
    case Status::kInvalid:
    case Status::kError: resp.message = r.str(kMaxMessageBytes, "message"); break;
  }
  r.finish();
  return resp;
}

Bytes frame(const Bytes& payload) {
  if (payload.empty() || payload.size() > kMaxFrameBytes) {
    throw ProtocolError(fmt::format("store frame of {} bytes (allowed 1..{})", payload.size(), kMaxFrameBytes));
  }
  Bytes out;
  out.reserve(4 + payload.size());
  const auto n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

uint32_t decode_frame_length(const uint8_t* header4) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(header4[i]) << (8 * i);
  if (n == 0 || n > kMaxFrameBytes) {
    throw ProtocolError(fmt::format("malformed store message: frame length {} (allowed 1..{})", n, kMaxFrameBytes));
  }
  return n;
}

}  // namespace zero::comm::wire
