#pragma once
// Wire protocol of the TCP store (version 1). All integers are little-endian.
//
// Hello (client -> server, first bytes of every connection; not length-prefixed so that a stray
// client, say an HTTP probe, is recognised by its first 4 bytes):
//   u32 magic (kMagic) | u16 version (kVersion) | u16 token length (<= kMaxTokenBytes) | token bytes
// Hello reply (server -> client), a frame whose payload is: u8 HelloStatus | str message.
// The server closes the connection after any reply other than kOk.
//
// Frames (both directions after the hello): u32 payload length (1..kMaxFrameBytes) | payload.
// Request payload:  u8 Op | fields of the op
//   kSet:        str key | bytes value
//   kGet:        str key | u64 timeout_ms      (server-side wait until the key exists)
//   kAdd:        str key | i64 delta
//   kCompareSet: str key | bytes expected | bytes desired
//   kDelete:     str key
//   kCheck:      u32 n | n x str key
//   kWait:       u32 n | n x str key | u64 timeout_ms
// Response payload: u8 Status | fields
//   kOk:      kGet/kCompareSet: bytes value; kAdd: i64; kDelete/kCheck: u8 bool; others: nothing
//   kTimeout: u32 n | n x str missing key
//   kInvalid, kError: str message
// str and bytes are u32 length | bytes. Lengths are bounded (keys, values, key counts) so that a
// peer cannot make the other side allocate without limit; a payload that is truncated, has trailing
// bytes, an unknown op or an oversized field is malformed (ProtocolError) and the server drops that
// one connection.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/store/store.h"

namespace zero::comm::wire {

constexpr uint32_t kMagic = 0x5a53544bu;  // "KTSZ" on the wire
constexpr uint16_t kVersion = 1;
constexpr size_t kHelloFixedBytes = 8;
constexpr size_t kMaxTokenBytes = 1024;
constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxValueBytes = size_t{64} << 20;
constexpr size_t kMaxKeys = 4096;
// Largest payload: a compare_set with two maximal values plus headers.
constexpr size_t kMaxFrameBytes = 2 * kMaxValueBytes + kMaxKeyBytes + 64;
// Largest hello reply / error message we send or accept.
constexpr size_t kMaxMessageBytes = 4096;

enum class Op : uint8_t { kSet = 1, kGet, kAdd, kCompareSet, kDelete, kCheck, kWait };
enum class Status : uint8_t { kOk = 0, kTimeout, kInvalid, kError };
enum class HelloStatus : uint8_t { kOk = 0, kBadMagic, kBadVersion, kBadToken };

const char* op_name(Op op);

// A malformed message. Derives from CommError: to a caller it is a broken connection.
class ProtocolError : public CommError {
 public:
  using CommError::CommError;
};

struct Request {
  Op op = Op::kSet;
  std::vector<std::string> keys;  // one key except for kCheck and kWait
  Bytes value;                    // kSet value, kCompareSet expected
  Bytes desired;                  // kCompareSet
  int64_t delta = 0;              // kAdd
  uint64_t timeout_ms = 0;        // kGet, kWait
};

struct Response {
  Status status = Status::kOk;
  Bytes value;                        // kGet, kCompareSet
  int64_t number = 0;                 // kAdd
  bool flag = false;                  // kDelete, kCheck
  std::vector<std::string> missing;   // kTimeout
  std::string message;                // kInvalid, kError
};

struct HelloHeader {
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t token_bytes = 0;
};

// Client side of the hello: fixed header followed by the token.
Bytes encode_hello(const std::string& token);
// Parses the fixed kHelloFixedBytes header (no validation of the values).
HelloHeader decode_hello_header(const uint8_t* data);
// Hello reply payload (without the frame length).
Bytes encode_hello_reply(HelloStatus status, const std::string& message);
void decode_hello_reply(const uint8_t* data, size_t size, HelloStatus* status, std::string* message);

// Payloads (without the frame length). encode_* throw InvalidArgument for a key, value or key list
// over the limits; decode_* throw ProtocolError on malformed input.
Bytes encode_request(const Request& req);
Request decode_request(const uint8_t* data, size_t size);
Bytes encode_response(Op op, const Response& resp);
Response decode_response(Op op, const uint8_t* data, size_t size);

// Prepends the u32 length. Throws ProtocolError when the payload is empty or over kMaxFrameBytes.
Bytes frame(const Bytes& payload);
// Reads the u32 length of a frame header and validates it (ProtocolError when 0 or too large).
uint32_t decode_frame_length(const uint8_t* header4);

}  // namespace zero::comm::wire
