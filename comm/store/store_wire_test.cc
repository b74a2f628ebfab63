// Wire protocol: round trips of every request and reply, and rejection of malformed input.
#include "comm/store/store_wire.h"

#include <doctest/doctest.h>

namespace zero::comm::wire {
namespace {

Bytes b(const std::string& s) { return Bytes(s.begin(), s.end()); }

Request round_trip(const Request& req) {
  const Bytes p = encode_request(req);
  return decode_request(p.data(), p.size());
}

TEST_CASE("requests round trip") {
  Request set{Op::kSet, {"key"}, b("value"), {}, 0, 0};
  Request r = round_trip(set);
  CHECK(r.op == Op::kSet);
  CHECK(r.keys == std::vector<std::string>{"key"});
  CHECK(r.value == b("value"));

  Request get{Op::kGet, {"k"}, {}, {}, 0, 12345};
  r = round_trip(get);
  CHECK(r.op == Op::kGet);
  CHECK(r.timeout_ms == 12345);

  Request add{Op::kAdd, {"n"}, {}, {}, -42, 0};
  CHECK(round_trip(add).delta == -42);

  Request cas{Op::kCompareSet, {"c"}, b("old"), b("new"), 0, 0};
  r = round_trip(cas);
  CHECK(r.value == b("old"));
  CHECK(r.desired == b("new"));

  Request wait{Op::kWait, {"a", "b", ""}, {}, {}, 0, 7};
  r = round_trip(wait);
  CHECK(r.keys == std::vector<std::string>{"a", "b", ""});
  CHECK(r.timeout_ms == 7);

  Request check{Op::kCheck, {}, {}, {}, 0, 0};
  CHECK(round_trip(check).keys.empty());
}

TEST_CASE("responses round trip") {
  Response ok;
  ok.value = b("v");
  Bytes p = encode_response(Op::kGet, ok);
  CHECK(decode_response(Op::kGet, p.data(), p.size()).value == b("v"));

  Response n;
  n.number = INT64_MIN;
  p = encode_response(Op::kAdd, n);
  CHECK(decode_response(Op::kAdd, p.data(), p.size()).number == INT64_MIN);

  Response flag;
  flag.flag = true;
  p = encode_response(Op::kCheck, flag);
  CHECK(decode_response(Op::kCheck, p.data(), p.size()).flag);

  Response timeout;
  timeout.status = Status::kTimeout;
  timeout.missing = {"x", "y"};
  p = encode_response(Op::kWait, timeout);
  const Response t = decode_response(Op::kWait, p.data(), p.size());
  CHECK(t.status == Status::kTimeout);
  CHECK(t.missing == std::vector<std::string>{"x", "y"});

  Response err;
  err.status = Status::kInvalid;
  err.message = "bad";
  p = encode_response(Op::kAdd, err);
  CHECK(decode_response(Op::kAdd, p.data(), p.size()).message == "bad");
}

TEST_CASE("hello") {
  const Bytes h = encode_hello("tok");
  REQUIRE(h.size() == kHelloFixedBytes + 3);
  const HelloHeader hh = decode_hello_header(h.data());
  CHECK(hh.magic == kMagic);
  CHECK(hh.version == kVersion);
  CHECK(hh.token_bytes == 3);
  CHECK_THROWS_AS(encode_hello(std::string(kMaxTokenBytes + 1, 'x')), InvalidArgument);

  const Bytes reply = encode_hello_reply(HelloStatus::kBadToken, "token mismatch");
  HelloStatus st = HelloStatus::kOk;
  std::string msg;
  decode_hello_reply(reply.data(), reply.size(), &st, &msg);
  CHECK(st == HelloStatus::kBadToken);
  CHECK(msg == "token mismatch");
}

TEST_CASE("malformed payloads are rejected") {
  const Bytes good = encode_request(Request{Op::kSet, {"key"}, b("value"), {}, 0, 0});
  // Every truncation fails.
  for (size_t n = 0; n < good.size(); ++n) {
    CAPTURE(n);
    CHECK_THROWS_AS(decode_request(good.data(), n), ProtocolError);
  }
  // Trailing bytes.
  Bytes longer = good;
  longer.push_back(0);
  CHECK_THROWS_AS(decode_request(longer.data(), longer.size()), ProtocolError);
  // Unknown ops.
  for (uint8_t op : {uint8_t{0}, uint8_t{8}, uint8_t{255}}) {
    Bytes p = good;
    p[0] = op;
    CHECK_THROWS_AS(decode_request(p.data(), p.size()), ProtocolError);
  }
  // A key length over the limit (and over the payload).
  Bytes huge_key = {static_cast<uint8_t>(Op::kDelete), 0xff, 0xff, 0xff, 0x7f};
  CHECK_THROWS_AS(decode_request(huge_key.data(), huge_key.size()), ProtocolError);
  // Too many keys.
  Bytes many = {static_cast<uint8_t>(Op::kCheck), 0xff, 0xff, 0xff, 0xff};
  CHECK_THROWS_AS(decode_request(many.data(), many.size()), ProtocolError);
  // Bad reply status and flag.
  const Bytes bad_status = {9};
  CHECK_THROWS_AS(decode_response(Op::kSet, bad_status.data(), bad_status.size()), ProtocolError);
  const Bytes bad_flag = {0, 2};
  CHECK_THROWS_AS(decode_response(Op::kCheck, bad_flag.data(), bad_flag.size()), ProtocolError);
}

TEST_CASE("frame lengths are bounded") {
  const uint8_t zero[4] = {0, 0, 0, 0};
  CHECK_THROWS_AS(decode_frame_length(zero), ProtocolError);
  const uint8_t absurd[4] = {0xff, 0xff, 0xff, 0xff};
  CHECK_THROWS_AS(decode_frame_length(absurd), ProtocolError);
  const uint8_t five[4] = {5, 0, 0, 0};
  CHECK(decode_frame_length(five) == 5);
  const Bytes f = frame(b("abc"));
  CHECK(f == Bytes{3, 0, 0, 0, 'a', 'b', 'c'});
  CHECK_THROWS_AS(frame({}), ProtocolError);
}

TEST_CASE("oversized caller input is an InvalidArgument") {
  CHECK_THROWS_AS(encode_request(Request{Op::kSet, {std::string(kMaxKeyBytes + 1, 'k')}, {}, {}, 0, 0}),
                  InvalidArgument);
  CHECK_THROWS_AS(encode_request(Request{Op::kSet, {"k"}, Bytes(kMaxValueBytes + 1), {}, 0, 0}),
                  InvalidArgument);
  CHECK_THROWS_AS(encode_request(Request{Op::kWait, std::vector<std::string>(kMaxKeys + 1, "k"), {}, {}, 0, 0}),
                  InvalidArgument);
  CHECK_THROWS_AS(encode_request(Request{Op::kGet, {}, {}, {}, 0, 0}), InvalidArgument);
}

}  // namespace
}  // namespace zero::comm::wire
