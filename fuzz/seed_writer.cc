// Writes the binary seeds of fuzz/corpus/store_wire and fuzz/corpus/safetensors with the library's
// own encoders, so that the seeds are what peers and writers really produce:
//
//   bazel run //fuzz:seed_writer -- $PWD/fuzz/corpus
//
// The malformed seeds are valid ones with one thing broken (a truncation, a length, an op), each
// one step from the valid path. The checkpoint and config seeds are text files kept as they are
// (fuzz/corpus/README.md says where they came from).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "comm/store/store_wire.h"
#include "zero/checkpoint/safetensors.h"

namespace {

using namespace zero::comm;
using namespace zero::comm::wire;

std::string g_dir;

void put(const std::string& name, const std::string& bytes) {
  const std::string path = g_dir + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  std::printf("%s (%zu bytes)\n", path.c_str(), bytes.size());
}
void put(const std::string& name, const Bytes& b) { put(name, std::string(b.begin(), b.end())); }

Bytes str_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

Request req(Op op, std::vector<std::string> keys) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  return r;
}

void store_wire() {
  Request set = req(Op::kSet, {"/gloo/rank_0"});
  set.value = str_bytes("10.0.0.1:29500");
  put("req-set", encode_request(set));
  put("req-set-empty-value", encode_request(req(Op::kSet, {"barrier/3"})));
  Request get = req(Op::kGet, {"nccl/unique_id"});
  get.timeout_ms = 300000;
  put("req-get", encode_request(get));
  Request add = req(Op::kAdd, {"counter"});
  add.delta = -7;
  put("req-add", encode_request(add));
  Request cas = req(Op::kCompareSet, {"leader"});
  cas.value = str_bytes("");
  cas.desired = str_bytes("rank-2");
  put("req-compare-set", encode_request(cas));
  put("req-delete", encode_request(req(Op::kDelete, {"stale"})));
  put("req-check", encode_request(req(Op::kCheck, {"a", "b", "rank/7"})));
  Request wait = req(Op::kWait, {"ready/0", "ready/1"});
  wait.timeout_ms = 1000;
  put("req-wait", encode_request(wait));

  Response value;
  value.value = str_bytes("\x01\x02\x03 nccl id bytes");
  put("resp-get-ok", encode_response(Op::kGet, value));
  Response number;
  number.number = 42;
  put("resp-add-ok", encode_response(Op::kAdd, number));
  Response flag;
  flag.flag = true;
  put("resp-check-ok", encode_response(Op::kCheck, flag));
  Response timeout;
  timeout.status = Status::kTimeout;
  timeout.missing = {"ready/1"};
  put("resp-wait-timeout", encode_response(Op::kWait, timeout));
  Response invalid;
  invalid.status = Status::kInvalid;
  invalid.message = "value of 'counter' is not an integer";
  put("resp-invalid", encode_response(Op::kAdd, invalid));

  put("hello", encode_hello("job-token-1234"));
  put("hello-reply-ok", encode_hello_reply(HelloStatus::kOk, ""));
  put("hello-reply-bad-token", encode_hello_reply(HelloStatus::kBadToken, "wrong job token"));
  // A connection's frames, as the client sends them.
  Bytes stream = frame(encode_request(set));
  const Bytes second = frame(encode_request(get));
  stream.insert(stream.end(), second.begin(), second.end());
  put("frames-set-get", stream);

  // Malformed, one thing each.
  Bytes truncated = encode_request(set);
  truncated.resize(truncated.size() - 3);
  put("bad-req-truncated", truncated);
  Bytes trailing = encode_request(get);
  trailing.push_back(0);
  put("bad-req-trailing-byte", trailing);
  Bytes op = encode_request(get);
  op[0] = 9;
  put("bad-req-unknown-op", op);
  Bytes key_len = encode_request(get);
  for (int i = 1; i <= 4; ++i) key_len[static_cast<size_t>(i)] = 0xFF;  // a 4 GB key
  put("bad-req-key-length", key_len);
  Bytes keys = encode_request(req(Op::kCheck, {"a"}));
  keys[1] = 0x01;  // 4097 keys
  keys[2] = 0x10;
  put("bad-req-key-count", keys);
  put("bad-frame-length-zero", std::string(4, '\0'));
  put("bad-frame-length-huge", std::string("\xff\xff\xff\x7f", 4));
}

void safetensors() {
  zero::SafetensorsLayout l;
  l.metadata["format"] = "pt";
  l.tensors = {{"wte.weight", zero::DType::kBFloat16, {8, 4}},
               {"h.0.ln_1.weight", zero::DType::kFloat32, {4}},
               {"h.0.attn.c_attn.bias", zero::DType::kFloat16, {12}},
               {"step", zero::DType::kInt64, {}},
               {"mask", zero::DType::kUInt8, {2, 3}},
               {"empty", zero::DType::kFloat64, {0, 5}},
               {"ids", zero::DType::kInt32, {3}}};
  const std::string header = zero::safetensors_header(l);
  const std::string file = header + std::string(l.file_bytes() - l.data_start, '\x3c');
  put("writer-mixed-dtypes.safetensors", file);
  zero::SafetensorsLayout one;
  one.tensors = {{"w", zero::DType::kFloat32, {2, 2}}};
  const std::string one_file = zero::safetensors_header(one) + std::string(16, '\0');
  put("writer-one-tensor.safetensors", one_file);
  zero::SafetensorsLayout none;
  put("writer-no-tensors.safetensors", zero::safetensors_header(none));

  std::string truncated = file;
  truncated.resize(truncated.size() - 1);
  put("bad-data-truncated.safetensors", truncated);
  std::string length = one_file;
  length[5] = '\x01';  // a header length of 1 TB
  put("bad-header-length.safetensors", length);
  put("bad-too-short.safetensors", std::string("\x10\0\0", 3));
  auto with_length = [](const std::string& json) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
    return s + json;
  };
  put("bad-hole.safetensors",
      with_length(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})") + std::string(8, '\0'));
  put("bad-overlap.safetensors",
      with_length(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],)"
                  R"("data_offsets":[2,4]}})") +
          std::string(4, '\0'));
  put("bad-dtype.safetensors",
      with_length(R"({"t":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})") + std::string(8, '\0'));
  put("bad-metadata.safetensors", with_length(R"({"__metadata__":{"format":1}})"));
  put("bad-not-json.safetensors", with_length("{nope"));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: seed_writer CORPUS_DIR (writes CORPUS_DIR/store_wire and CORPUS_DIR/safetensors)\n");
    return 2;
  }
  g_dir = std::string(argv[1]) + "/store_wire";
  store_wire();
  g_dir = std::string(argv[1]) + "/safetensors";
  safetensors();
  return 0;
}
