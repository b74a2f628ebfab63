#include "comm/schedule_check.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "base/error.h"

namespace zero::comm {
namespace {

TEST_CASE("calls are described the way error messages print them") {
  CHECK(describe_call(make_reduce_call(7, CollectiveKind::kAllReduce, DType::kFloat32, 1024,
                                       ReduceOp::kSum)) == "all_reduce(fp32, 1024, sum) #7");
  CHECK(describe_call(make_call(7, CollectiveKind::kAllGather, DType::kFloat32, 512)) ==
        "all_gather(fp32, 512) #7");
  CHECK(describe_call(make_broadcast_call(2, DType::kInt64, 3, 1)) ==
        "broadcast(int64, 3, root 1) #2");
  CHECK(describe_call(make_call(0, CollectiveKind::kBarrier, DType::kUInt8, 0)) == "barrier() #0");
}

TEST_CASE("records round-trip and detect corruption") {
  const CallInfo c = make_reduce_call(123456789012ull, CollectiveKind::kReduceScatter,
                                      DType::kBFloat16, 1000003, ReduceOp::kAvg);
  CallRecord r = encode_call(c);
  const CallInfo d = decode_call(r);
  CHECK(describe_call(d) == describe_call(c));
  CHECK(call_hash(d) == call_hash(c));
  r[8] ^= 1;  // count changed but hash not
  CHECK_THROWS_AS(decode_call(r), CommError);
  r = encode_call(c);
  r[24] = 200;
  CHECK_THROWS_AS(decode_call(r), CommError);
}

TEST_CASE("the hash depends on every field but the sequence number") {
  const CallInfo a = make_reduce_call(1, CollectiveKind::kAllReduce, DType::kFloat32, 8,
                                      ReduceOp::kSum);
  CallInfo b = a;
  b.seq = 2;
  CHECK(call_hash(a) == call_hash(b));
  b = a;
  b.count = 9;
  CHECK(call_hash(a) != call_hash(b));
  b = a;
  b.dtype = DType::kFloat16;
  CHECK(call_hash(a) != call_hash(b));
  b = a;
  b.reduce_op = ReduceOp::kMax;
  CHECK(call_hash(a) != call_hash(b));
  b = a;
  b.kind = CollectiveKind::kReduceScatter;
  CHECK(call_hash(a) != call_hash(b));
  CHECK(call_hash(make_broadcast_call(0, DType::kFloat32, 8, 0)) !=
        call_hash(make_broadcast_call(0, DType::kFloat32, 8, 1)));
}

TEST_CASE("mismatches name rank 0's call and the first differing rank's call") {
  const CallInfo ar = make_reduce_call(7, CollectiveKind::kAllReduce, DType::kFloat32, 1024,
                                       ReduceOp::kSum);
  const CallInfo ag = make_call(7, CollectiveKind::kAllGather, DType::kFloat32, 512);
  CHECK(find_schedule_mismatch({encode_call(ar), encode_call(ar), encode_call(ar)}).empty());
  CHECK(find_schedule_mismatch({encode_call(ar), encode_call(ar), encode_call(ag)}) ==
        "schedule mismatch: rank 0 called all_reduce(fp32, 1024, sum) #7 but rank 2 called "
        "all_gather(fp32, 512) #7");
  CallInfo later = ar;
  later.seq = 8;
  CHECK(find_schedule_mismatch({encode_call(ar), encode_call(later)}) ==
        "schedule mismatch: rank 0 called all_reduce(fp32, 1024, sum) #7 but rank 1 called "
        "all_reduce(fp32, 1024, sum) #8");
}

TEST_CASE("labels travel in the record, take part in the hash and the comparison, and are cut to fit") {
  CallInfo a = make_call(7, CollectiveKind::kAllGather, DType::kFloat32, 512);
  a.label = "unit 3 forward";
  CHECK(describe_call(a) == "all_gather(fp32, 512) #7 [unit 3 forward]");
  const CallInfo d = decode_call(encode_call(a));
  CHECK(d.label == "unit 3 forward");
  CallInfo b = a;
  b.label = "unit 4 forward";
  CHECK(call_hash(a) != call_hash(b));
  CHECK(find_schedule_mismatch({encode_call(a), encode_call(a)}).empty());
  CHECK(find_schedule_mismatch({encode_call(a), encode_call(b)}) ==
        "schedule mismatch: rank 0 called all_gather(fp32, 512) #7 [unit 3 forward] but rank 1 called "
        "all_gather(fp32, 512) #7 [unit 4 forward]");
  CallInfo none = a;
  none.label.clear();
  CHECK_FALSE(find_schedule_mismatch({encode_call(a), encode_call(none)}).empty());
  // A label of exactly kCallLabelBytes round-trips; longer ones are cut, never inside a character.
  a.label = std::string(kCallLabelBytes, 'x');
  CHECK(decode_call(encode_call(a)).label == a.label);
  CHECK(fit_call_label(std::string(40, 'y')) == std::string(kCallLabelBytes, 'y'));
  const std::string accented = std::string(kCallLabelBytes - 1, 'z') + "\xc3\xa9";  // "...zé"
  CHECK(fit_call_label(accented) == std::string(kCallLabelBytes - 1, 'z'));
  // A corrupted label is caught by the hash.
  a.label = "unit 3 forward";
  CallRecord r = encode_call(a);
  r[32] ^= 1;
  CHECK_THROWS_AS(decode_call(r), CommError);
}

TEST_CASE("point-to-point records name the peer and pair a send with its receive") {
  CallInfo send = make_p2p_call(3, CollectiveKind::kSend, DType::kFloat32, 100, 1);
  send.label = "stage 0 act";
  CallInfo recv = make_p2p_call(3, CollectiveKind::kRecv, DType::kFloat32, 100, 0);
  recv.label = "stage 0 act";
  CHECK(describe_call(send) == "send(fp32, 100, to rank 1) #3 [stage 0 act]");
  CHECK(describe_call(recv) == "recv(fp32, 100, from rank 0) #3 [stage 0 act]");
  CHECK(describe_call(decode_call(encode_call(recv))) == describe_call(recv));
  CHECK(find_p2p_mismatch(encode_call(send), 0, encode_call(recv), 1).empty());
  const std::string both =
      "p2p mismatch: rank 0 called send(fp32, 100, to rank 1) #3 [stage 0 act] but rank 1 called ";
  CallInfo other = recv;
  other.count = 99;
  CHECK(find_p2p_mismatch(encode_call(send), 0, encode_call(other), 1) ==
        both + "recv(fp32, 99, from rank 0) #3 [stage 0 act]");
  other = recv;
  other.dtype = DType::kInt32;
  CHECK(find_p2p_mismatch(encode_call(send), 0, encode_call(other), 1) ==
        both + "recv(int32, 100, from rank 0) #3 [stage 0 act]");
  other = recv;
  other.label = "stage 0 grad";
  CHECK_FALSE(find_p2p_mismatch(encode_call(send), 0, encode_call(other), 1).empty());
  other = recv;
  other.seq = 4;
  CHECK_FALSE(find_p2p_mismatch(encode_call(send), 0, encode_call(other), 1).empty());
  // Two sends never pair, nor does a record that names another rank.
  CHECK_FALSE(find_p2p_mismatch(encode_call(send), 0, encode_call(send), 1).empty());
  CHECK_FALSE(find_p2p_mismatch(encode_call(send), 0, encode_call(recv), 2).empty());
  CHECK_THROWS_AS(make_p2p_call(0, CollectiveKind::kBarrier, DType::kFloat32, 1, 1), CheckError);
}

TEST_CASE("ZERO_COMM_CHECK switches the check") {
  unsetenv("ZERO_COMM_CHECK");
  CHECK(schedule_check_from_env(true));
  setenv("ZERO_COMM_CHECK", "0", 1);
  CHECK_FALSE(schedule_check_from_env(true));
  setenv("ZERO_COMM_CHECK", "1", 1);
  CHECK(schedule_check_from_env(false));
  setenv("ZERO_COMM_CHECK", "maybe", 1);
  CHECK_THROWS_AS(schedule_check_from_env(true), InvalidArgument);
  unsetenv("ZERO_COMM_CHECK");
}

TEST_CASE("reduce op names") {
  CHECK(std::string(reduce_op_name(ReduceOp::kAvg)) == "avg");
  CHECK(parse_reduce_op("min") == ReduceOp::kMin);
  CHECK_THROWS_AS(parse_reduce_op("prod"), InvalidArgument);
}

}  // namespace
}  // namespace zero::comm
