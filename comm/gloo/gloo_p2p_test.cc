// Point-to-point transfers on the Gloo communicator, every rank a thread of this process (one
// MemoryStore): payloads bit for bit, ordering, both directions at once, p2p beside collectives,
// the pairing check (no receive, wrong count, dtype or label), a peer destroyed mid-transfer, and
// argument errors.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/store/memory_store.h"

namespace zero::comm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

GlooOptions options(std::chrono::milliseconds timeout = 20s, bool check = true) {
  GlooOptions o;
  o.timeout = timeout;
  o.check_schedule = check;
  o.failure_report_grace = 0ms;
  return o;
}

void run_ranks(int size, const GlooOptions& o, const std::function<void(int, Communicator&)>& fn) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto comm = make_gloo_communicator(store, r, size, o);
      fn(r, *comm);
    });
  }
  for (auto& t : threads) t.join();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The bytes rank `from` sends in transfer `k` (never all zero, so a transfer that moved nothing
// shows).
std::vector<uint8_t> pattern(int from, int k, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  uint32_t x = 2654435761u * static_cast<uint32_t>(from + 1) + 40503u * static_cast<uint32_t>(k + 1);
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                             DType::kInt32,   DType::kInt64,   DType::kUInt8};

// The message of the error a Work's wait throws; fails the test when it throws none, or another
// kind than E.
template <typename E>
std::string wait_error(const WorkHandle& w) {
  try {
    w->wait();
  } catch (const E& e) {
    return e.what();
  } catch (const Error& e) {
    FAIL_CHECK("unexpected kind of error: ", e.what());
    return e.what();
  }
  FAIL_CHECK("the wait did not throw");
  return {};
}

TEST_CASE("a ring exchange is bit for bit at 2, 3 and 4 ranks, every dtype, odd sizes") {
  for (bool check : {true, false}) {
    for (int size : {2, 3, 4}) {
      CAPTURE(check);
      CAPTURE(size);
      run_ranks(size, options(20s, check), [&](int rank, Communicator& comm) {
        const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        int k = 0;
        for (DType t : kDTypes) {
          for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{100003}}) {
            const size_t bytes = count * dtype_size(t);
            const std::vector<uint8_t> out = pattern(rank, k, bytes);
            std::vector<uint8_t> in(bytes, 0);
            // Receive first on even ranks, send first on odd ones: either order must work.
            WorkHandle s, r;
            if (rank % 2 == 0) {
              r = comm.recv(in.data(), count, t, prev);
              s = comm.send(out.data(), count, t, next);
            } else {
              s = comm.send(out.data(), count, t, next);
              r = comm.recv(in.data(), count, t, prev);
            }
            r->wait();
            s->wait();
            CHECK_MESSAGE(in == pattern(prev, k, bytes), dtype_name(t), " count ", count);
            ++k;
          }
        }
      });
    }
  }
}

TEST_CASE("a thousand small messages arrive in order with several in flight") {
  constexpr int kMessages = 1000;
  constexpr size_t kWindow = 8;
  run_ranks(2, options(), [&](int rank, Communicator& comm) {
    // Message i holds (i % 5) + 1 int32 values, all equal to i: sizes vary, so messages of one
    // size are not consecutive and the per-transfer slots must still keep them in order.
    auto count_of = [](int i) { return static_cast<size_t>(i % 5) + 1; };
    std::deque<std::pair<WorkHandle, std::vector<int32_t>>> in_flight;
    int checked = 0;
    bool in_order = true;
    for (int i = 0; i < kMessages; ++i) {
      if (rank == 0) {
        std::vector<int32_t> msg(count_of(i), i);
        in_flight.emplace_back(WorkHandle{}, std::move(msg));
        in_flight.back().first = comm.send(in_flight.back().second.data(), count_of(i), DType::kInt32, 1);
      } else {
        in_flight.emplace_back(WorkHandle{}, std::vector<int32_t>(count_of(i), -1));
        in_flight.back().first = comm.recv(in_flight.back().second.data(), count_of(i), DType::kInt32, 0);
      }
      while (in_flight.size() > kWindow || (i == kMessages - 1 && !in_flight.empty())) {
        in_flight.front().first->wait();
        if (rank == 1) {
          for (int32_t v : in_flight.front().second) in_order = in_order && v == checked;
          ++checked;
        }
        in_flight.pop_front();
      }
    }
    if (rank == 1) {
      CHECK(checked == kMessages);
      CHECK(in_order);
    }
  });
}

TEST_CASE("two ranks send to each other at once without deadlock") {
  // Larger than any socket buffer: a send that waited for its own receive would hang here.
  constexpr size_t kCount = size_t{4} << 20;
  run_ranks(2, options(), [&](int rank, Communicator& comm) {
    const int peer = 1 - rank;
    const std::vector<uint8_t> out = pattern(rank, 0, kCount);
    std::vector<uint8_t> in(kCount, 0);
    WorkHandle s = comm.send(out.data(), kCount, DType::kUInt8, peer);
    WorkHandle r = comm.recv(in.data(), kCount, DType::kUInt8, peer);
    s->wait();
    r->wait();
    CHECK(in == pattern(peer, 0, kCount));
  });
}

TEST_CASE("transfers interleave with collectives on one communicator") {
  run_ranks(3, options(), [&](int rank, Communicator& comm) {
    const int next = (rank + 1) % 3, prev = (rank + 2) % 3;
    for (int round = 0; round < 20; ++round) {
      CAPTURE(round);
      std::vector<float> sum(1000, static_cast<float>(rank + round));
      const std::vector<uint8_t> out = pattern(rank, round, 3001);
      std::vector<uint8_t> in(3001, 0);
      WorkHandle r = comm.recv(in.data(), in.size(), DType::kUInt8, prev);
      WorkHandle reduce = comm.all_reduce(sum.data(), sum.size(), DType::kFloat32, ReduceOp::kSum);
      WorkHandle s = comm.send(out.data(), out.size(), DType::kUInt8, next);
      WorkHandle b = comm.barrier();
      // Waits in an order other than issue order: transfers do not queue behind collectives.
      if (round % 2 == 0) {
        r->wait();
        s->wait();
        b->wait();
        reduce->wait();
      } else {
        b->wait();
        s->wait();
        reduce->wait();
        r->wait();
      }
      CHECK(in == pattern(prev, round, 3001));
      CHECK(sum[999] == static_cast<float>(3 * round + 3));
    }
  });
}

TEST_CASE("transfers between two ranks do not involve the third") {
  run_ranks(3, options(), [&](int rank, Communicator& comm) {
    if (rank < 2) {
      std::vector<uint8_t> in(100, 0);
      const std::vector<uint8_t> out = pattern(rank, 0, 100);
      WorkHandle s = comm.send(out.data(), 100, DType::kUInt8, 1 - rank);
      WorkHandle r = comm.recv(in.data(), 100, DType::kUInt8, 1 - rank);
      s->wait();
      r->wait();
      CHECK(in == pattern(1 - rank, 0, 100));
    }
    comm.barrier()->wait();  // rank 2 issued no transfer, and its collectives' numbering is unchanged
  });
}

TEST_CASE("is_completed makes progress without a wait") {
  run_ranks(2, options(), [&](int rank, Communicator& comm) {
    std::vector<uint8_t> buf = rank == 0 ? pattern(0, 0, 50000) : std::vector<uint8_t>(50000, 0);
    WorkHandle w = rank == 0 ? comm.send(buf.data(), buf.size(), DType::kUInt8, 1)
                             : comm.recv(buf.data(), buf.size(), DType::kUInt8, 0);
    const auto deadline = Clock::now() + 10s;
    while (!w->is_completed() && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    CHECK(w->is_completed());
    w->wait();  // completed: returns at once
    if (rank == 1) CHECK(buf == pattern(0, 0, 50000));
  });
}

TEST_CASE("a send nobody receives fails on both ranks within the timeout, naming the peer and label") {
  constexpr auto kTimeout = 1500ms;
  GlooOptions o = options(kTimeout);
  o.failure_report_grace = 2s;  // time for the peer's note (see below)
  run_ranks(2, o, [&](int rank, Communicator& comm) {
    // Both ranks send, neither receives: each send waits for its peer's receive.
    const int peer = 1 - rank;
    std::vector<float> buf(100, 1.0f);
    comm.set_call_label(rank == 0 ? "stage 0 act" : "stage 1 grad");
    const auto start = Clock::now();
    WorkHandle s = comm.send(buf.data(), buf.size(), DType::kFloat32, peer);
    std::string e;
    bool timed_out = false;
    try {
      s->wait();
      FAIL_CHECK("the send completed");
    } catch (const TimeoutError& err) {
      e = err.what();
      timed_out = true;
    } catch (const CommError& err) {
      e = err.what();
    }
    CHECK(Clock::now() - start < kTimeout + 4s);
    CAPTURE(e);
    CHECK(contains(e, fmt::format("gloo rank {}: send(fp32, 100, to rank {}) #0", rank, peer)));
    CHECK(contains(e, rank == 0 ? "[stage 0 act]" : "[stage 1 grad]"));
    // The first rank to time out says so; its peer sees the connection close a moment before its
    // own deadline, and says why from the note the first left in the store.
    if (timed_out) {
      CHECK(contains(e, fmt::format("timed out waiting for rank {} (its matching recv; did rank {} post it?)", peer, peer)));
    } else {
      CHECK(contains(e, fmt::format("the connection to rank {} broke", peer)));
      CHECK(contains(e, fmt::format("(rank {} reported: gloo rank {}: send(fp32, 100, to rank {}) #0", peer, peer, rank)));
    }
    // The communicator failed: later calls are rejected at once, collectives included.
    try {
      comm.send(buf.data(), buf.size(), DType::kFloat32, peer);
      FAIL_CHECK("a send after the failure was accepted");
    } catch (const CommError& err) {
      CHECK(contains(err.what(), "communicator failed earlier"));
    }
    CHECK_THROWS_AS(comm.barrier()->wait(), CommError);
  });
}

// Rank 0 sends 100 fp32 labelled "act"; rank 1 posts the receive described by `recv_count`,
// `recv_dtype` and `recv_label`. Both must fail at once (well inside the timeout) with one message.
void check_mismatch(size_t recv_count, DType recv_dtype, const char* recv_label,
                    const std::string& expected) {
  constexpr auto kTimeout = 10s;
  run_ranks(2, options(kTimeout), [&](int rank, Communicator& comm) {
    std::vector<uint8_t> buf(1024, 0);
    const auto start = Clock::now();
    WorkHandle w;
    if (rank == 0) {
      comm.set_call_label("act");
      w = comm.send(buf.data(), 100, DType::kFloat32, 1);
    } else {
      comm.set_call_label(recv_label);
      w = comm.recv(buf.data(), recv_count, recv_dtype, 0);
    }
    const std::string e = wait_error<CommError>(w);
    CHECK(Clock::now() - start < kTimeout / 2);
    CAPTURE(e);
    CHECK(contains(e, expected));
  });
}

TEST_CASE("a receive of another count fails on both ranks, naming both calls") {
  check_mismatch(99, DType::kFloat32, "act",
                 "p2p mismatch: rank 0 called send(fp32, 100, to rank 1) #0 [act] but rank 1 "
                 "called recv(fp32, 99, from rank 0) #0 [act]");
}

TEST_CASE("a receive of another dtype fails on both ranks, even with the same byte size") {
  check_mismatch(100, DType::kInt32, "act",
                 "p2p mismatch: rank 0 called send(fp32, 100, to rank 1) #0 [act] but rank 1 "
                 "called recv(int32, 100, from rank 0) #0 [act]");
  check_mismatch(50, DType::kFloat64, "act",
                 "p2p mismatch: rank 0 called send(fp32, 100, to rank 1) #0 [act] but rank 1 "
                 "called recv(fp64, 50, from rank 0) #0 [act]");
}

TEST_CASE("a receive with another label fails on both ranks") {
  check_mismatch(100, DType::kFloat32, "grad",
                 "p2p mismatch: rank 0 called send(fp32, 100, to rank 1) #0 [act] but rank 1 "
                 "called recv(fp32, 100, from rank 0) #0 [grad]");
}

TEST_CASE("zero-byte transfers meet their partners and are checked like the others") {
  run_ranks(2, options(), [&](int rank, Communicator& comm) {
    std::vector<float> buf(4, 7.0f);
    // Zero elements from a null buffer, then a real transfer: it must be the next one, not this.
    if (rank == 0) {
      comm.send(nullptr, 0, DType::kFloat32, 1)->wait();
      comm.send(buf.data(), 4, DType::kFloat32, 1)->wait();
    } else {
      comm.recv(nullptr, 0, DType::kFloat32, 0)->wait();
      std::vector<float> in(4, 0.0f);
      comm.recv(in.data(), 4, DType::kFloat32, 0)->wait();
      CHECK(in == buf);
    }
  });
  check_mismatch(0, DType::kFloat32, "act",
                 "p2p mismatch: rank 0 called send(fp32, 100, to rank 1) #0 [act] but rank 1 "
                 "called recv(fp32, 0, from rank 0) #0 [act]");
}

TEST_CASE("a partner posted long after its transfer stalled is not a mismatch") {
  // Rank 1 posts its receives well past the stall check's delay: rank 0 publishes its pending sends
  // and looks at rank 1's calls, finds none (then agreeing ones), and the transfers complete.
  run_ranks(2, options(), [&](int rank, Communicator& comm) {
    std::vector<int32_t> a(5), b(300);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>(i + 1);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int32_t>(1000 + i);
    comm.set_call_label("late");
    if (rank == 0) {
      WorkHandle first = comm.send(a.data(), a.size(), DType::kInt32, 1);
      WorkHandle second = comm.send(b.data(), b.size(), DType::kInt32, 1);
      first->wait();
      second->wait();
    } else {
      std::this_thread::sleep_for(800ms);
      std::vector<int32_t> ra(5, 0), rb(300, 0);
      WorkHandle first = comm.recv(ra.data(), ra.size(), DType::kInt32, 0);
      std::this_thread::sleep_for(600ms);  // the second stalls on this side too
      WorkHandle second = comm.recv(rb.data(), rb.size(), DType::kInt32, 0);
      first->wait();
      second->wait();
      CHECK(ra == a);
      CHECK(rb == b);
    }
    comm.barrier()->wait();  // the communicator did not fail
  });
}

TEST_CASE("without the check a receive of another size times out instead of corrupting") {
  constexpr auto kTimeout = 1500ms;
  run_ranks(2, options(kTimeout, /*check=*/false), [&](int rank, Communicator& comm) {
    std::vector<float> buf(100, 0.0f);
    WorkHandle w = rank == 0 ? comm.send(buf.data(), 100, DType::kFloat32, 1)
                             : comm.recv(buf.data(), 99, DType::kFloat32, 0);
    // The first to time out closes its connections; its peer may see that a moment before its own
    // deadline.
    std::string e;
    try {
      w->wait();
      FAIL_CHECK("the wait did not throw");
    } catch (const Error& err) {
      e = err.what();
    }
    CHECK(contains(e, rank == 0 ? "send(fp32, 100, to rank 1) #0" : "recv(fp32, 99, from rank 0) #0"));
  });
}

TEST_CASE("without the check a later transfer never overtakes an earlier one of another size") {
  // Rank 1 receives in the wrong order. Were transfers matched by size alone, its first receive
  // would take rank 0's second message and both would "succeed" with the data swapped; the transfer
  // number in the slot keeps each receive to its own send, so both ranks time out instead.
  constexpr auto kTimeout = 1500ms;
  run_ranks(2, options(kTimeout, /*check=*/false), [&](int rank, Communicator& comm) {
    std::vector<float> small(4, 1.0f), large(8, 2.0f);
    WorkHandle first, second;
    if (rank == 0) {
      first = comm.send(small.data(), 4, DType::kFloat32, 1);
      second = comm.send(large.data(), 8, DType::kFloat32, 1);
    } else {
      first = comm.recv(large.data(), 8, DType::kFloat32, 0);
      second = comm.recv(small.data(), 4, DType::kFloat32, 0);
    }
    for (const WorkHandle& w : {first, second}) {
      try {
        w->wait();
        FAIL_CHECK("a transfer completed against a receive of another transfer");
      } catch (const Error& e) {
        CHECK(contains(e.what(), rank == 0 ? "to rank 1" : "from rank 0"));
      }
    }
  });
}

TEST_CASE("a peer destroyed mid-transfer ends the waiting rank at once, naming it") {
  constexpr auto kTimeout = 20s;
  auto store = std::make_shared<MemoryStore>();
  std::string error0, error1;
  std::chrono::steady_clock::duration took0{};
  std::thread t0([&] {
    auto comm = make_gloo_communicator(store, 0, 2, options(kTimeout));
    std::vector<uint8_t> in(size_t{1} << 20, 0);
    comm->set_call_label("stage 1 act");
    const auto start = Clock::now();
    WorkHandle r = comm->recv(in.data(), in.size(), DType::kUInt8, 1);
    error0 = wait_error<CommError>(r);
    took0 = Clock::now() - start;
  });
  std::thread t1([&] {
    auto comm = make_gloo_communicator(store, 1, 2, options(kTimeout));
    std::vector<uint8_t> in(64, 0);
    // A transfer of its own is pending when it goes (a receive rank 0 never sends).
    WorkHandle r = comm->recv(in.data(), in.size(), DType::kUInt8, 0);
    std::this_thread::sleep_for(200ms);
    comm.reset();
    error1 = wait_error<CommError>(r);
  });
  t0.join();
  t1.join();
  CAPTURE(error0);
  CAPTURE(error1);
  CHECK(took0 < kTimeout / 2);
  CHECK(contains(error0, "gloo rank 0: recv(uint8, 1048576, from rank 1) #0 [stage 1 act]"));
  CHECK(contains(error0, "rank 1"));
  CHECK(contains(error1, "recv(uint8, 64, from rank 0) #0"));
  CHECK(contains(error1, "destroyed"));
}

TEST_CASE("a failed collective fails pending transfers, and a failed transfer the collectives") {
  run_ranks(2, options(10s), [&](int rank, Communicator& comm) {
    std::vector<float> buf(16, 0.0f);
    // A receive nobody matches, then mismatched collectives: the collective's failure ends it.
    WorkHandle r = comm.recv(buf.data(), 10, DType::kFloat32, 1 - rank);
    WorkHandle c = rank == 0 ? comm.all_reduce(buf.data(), 10, DType::kFloat32, ReduceOp::kSum)
                             : comm.all_reduce(buf.data(), 11, DType::kFloat32, ReduceOp::kSum);
    const std::string ce = wait_error<CommError>(c);
    CHECK(contains(ce, "schedule mismatch"));
    const std::string re = wait_error<CommError>(r);
    CAPTURE(re);
    CHECK(contains(re, fmt::format("recv(fp32, 10, from rank {}) #0", 1 - rank)));
    CHECK(contains(re, "schedule mismatch"));
  });
  run_ranks(2, options(10s), [&](int rank, Communicator& comm) {
    std::vector<float> buf(10, 0.0f);
    WorkHandle w = rank == 0 ? comm.send(buf.data(), 10, DType::kFloat32, 1)
                             : comm.recv(buf.data(), 9, DType::kFloat32, 0);
    CHECK(contains(wait_error<CommError>(w), "p2p mismatch"));
    try {
      comm.all_reduce(buf.data(), 10, DType::kFloat32, ReduceOp::kSum)->wait();
      FAIL_CHECK("a collective after the failed transfer ran");
    } catch (const CommError& e) {
      CHECK(contains(e.what(), "p2p mismatch"));
    }
  });
}

TEST_CASE("transfer arguments are checked on the caller's thread") {
  run_ranks(2, options(), [&](int rank, Communicator& comm) {
    std::vector<float> buf(4, 0.0f);
    auto error = [&](const std::function<void()>& call) -> std::string {
      try {
        call();
      } catch (const InvalidArgument& e) {
        return e.what();
      }
      return "no error";
    };
    CHECK(contains(error([&] { comm.send(buf.data(), 4, DType::kFloat32, 2); }), "send: peer 2 is out of range [0, 2)"));
    CHECK(contains(error([&] { comm.recv(buf.data(), 4, DType::kFloat32, -1); }), "recv: peer -1 is out of range"));
    CHECK(contains(error([&] { comm.send(buf.data(), 4, DType::kFloat32, rank); }), fmt::format("send: peer {} is this rank", rank)));
    CHECK(contains(error([&] { comm.recv(nullptr, 4, DType::kFloat32, 1 - rank); }), "recv: buf is null with count 4"));
    CHECK(contains(error([&] { comm.send(buf.data(), std::numeric_limits<size_t>::max() / 2, DType::kFloat32, 1 - rank); }),
                   "send: buf of"));
    CHECK(contains(error([&] { comm.send(buf.data(), size_t{1} << 40, DType::kUInt8, 1 - rank); }),
                   "one Gloo transfer can carry"));
    // None of them was numbered: the next transfers are #0 and still meet.
    std::vector<float> in(4, 0.0f);
    WorkHandle s = comm.send(buf.data(), 4, DType::kFloat32, 1 - rank);
    WorkHandle r = comm.recv(in.data(), 4, DType::kFloat32, 1 - rank);
    s->wait();
    r->wait();
    // Empty transfers need no buffer, and still pair.
    WorkHandle s0 = comm.send(nullptr, 0, DType::kFloat32, 1 - rank);
    WorkHandle r0 = comm.recv(nullptr, 0, DType::kFloat32, 1 - rank);
    s0->wait();
    r0->wait();
  });
}

}  // namespace
}  // namespace zero::comm
