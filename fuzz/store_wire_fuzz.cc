// Fuzz target: the TCP store's wire protocol (comm/store/store_wire.h), the bytes a peer sends.
//
// Every decoder reads the same input: as a request payload, as a reply payload to each op, as a
// hello reply, as the first bytes of a connection (hello header) and as a stream of frames, each
// decoded as a request, the way the server reads a connection. Malformed input must end in
// ProtocolError; any other exception escapes and is a finding. Whatever decodes must encode back to
// the same bytes: the format has one encoding per message, so a difference means the decoder
// accepted something the protocol does not define (or the encoder and decoder disagree).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "comm/store/store_wire.h"
#include "fuzz/fuzz_check.h"

namespace {

using namespace zero::comm;
using namespace zero::comm::wire;

bool same(const Bytes& encoded, const uint8_t* data, size_t size) {
  return encoded.size() == size && (size == 0 || std::memcmp(encoded.data(), data, size) == 0);
}

void request(const uint8_t* data, size_t size) {
  Request req;
  try {
    req = decode_request(data, size);
  } catch (const ProtocolError&) {
    return;
  }
  FUZZ_CHECK(same(encode_request(req), data, size), "a %zu-byte %s request does not re-encode to itself", size,
             op_name(req.op));
}

void response(Op op, const uint8_t* data, size_t size) {
  Response resp;
  try {
    resp = decode_response(op, data, size);
  } catch (const ProtocolError&) {
    return;
  }
  FUZZ_CHECK(same(encode_response(op, resp), data, size), "a %zu-byte reply to %s does not re-encode to itself",
             size, op_name(op));
}

void hello(const uint8_t* data, size_t size) {
  if (size >= kHelloFixedBytes) {
    const HelloHeader h = decode_hello_header(data);
    // What the server does next: read token_bytes more when magic and version match.
    if (h.magic == kMagic && h.version == kVersion && h.token_bytes <= kMaxTokenBytes &&
        size - kHelloFixedBytes >= h.token_bytes) {
      const std::string token(reinterpret_cast<const char*>(data) + kHelloFixedBytes, h.token_bytes);
      FUZZ_CHECK(same(encode_hello(token), data, kHelloFixedBytes + h.token_bytes), "the hello does not re-encode");
    }
  }
  HelloStatus status{};
  std::string message;
  try {
    decode_hello_reply(data, size, &status, &message);
  } catch (const ProtocolError&) {
    return;
  }
  FUZZ_CHECK(same(encode_hello_reply(status, message), data, size), "a %zu-byte hello reply does not re-encode",
             size);
}

// The input as a connection's frames: length, payload, length, payload... as the server reads them
// (a bad length ends the connection).
void frames(const uint8_t* data, size_t size) {
  size_t at = 0;
  while (size - at >= 4) {
    uint32_t n = 0;
    try {
      n = decode_frame_length(data + at);
    } catch (const ProtocolError&) {
      return;
    }
    FUZZ_CHECK(n >= 1 && n <= kMaxFrameBytes, "frame length %u accepted", n);
    at += 4;
    if (size - at < n) return;  // the rest has not arrived
    request(data + at, n);
    at += n;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  request(data, size);
  for (uint8_t op = static_cast<uint8_t>(Op::kSet); op <= static_cast<uint8_t>(Op::kWait); ++op) {
    response(static_cast<Op>(op), data, size);
  }
  hello(data, size);
  frames(data, size);
  return 0;
}
