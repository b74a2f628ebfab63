// One rank of the multi-process Gloo tests (comm/gloo/gloo_multiprocess_test.sh runs it under zerorun).
// Joins the job with init_process_group() and runs one scenario; exits 0 when the scenario behaved
// as required, 1 otherwise, printing one "rank R: ..." line per finding.
//
//   gloo_test_worker suite [--large N] [--eager-bytes B]
//                                        every collective, dtype, reduce op, size, in/out of place
//   gloo_test_worker die                 the last rank exits in the middle of an all_reduce; the
//                                        others must fail with CommError/TimeoutError in time
//   gloo_test_worker mismatch            ranks issue different collectives; all must report it
//   gloo_test_worker split               split by parity; collectives inside each group
//   gloo_test_worker p2p [--large N]     send/recv around the ring both ways (every dtype, sizes 0,
//                                        1, 7, 1000, N), then a stream of 1000 small messages
//                                        along the ring; every byte checked
//   gloo_test_worker p2p-mismatch        rank 1 receives 99 of the 100 floats rank 0 sends; both
//                                        must name the two calls well before the timeout
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/launch/process_group.h"
#include "comm/test_programs/collective_checks.h"

namespace zero::comm {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

int suite(ProcessGroup& pg, size_t large) {
  Communicator& comm = *pg.host;
  testing::SuiteOptions s;
  s.sizes = {1, 7, 1000};
  s.large = large;
  testing::CheckReport report;
  testing::check_all_collectives(comm, s, report);
  testing::check_fp16_accumulation(comm, report);
  std::printf("rank %d: suite on %d ranks (device communicator: %s): %s\n", comm.rank(),
              comm.size(), pg.device ? pg.device->backend_name().c_str() : "none",
              report.summary().c_str());
  return report.ok() && report.checks > 0 ? 0 : 1;
}

int die(ProcessGroup& pg) {
  Communicator& comm = *pg.host;
  const int me = comm.rank(), n = comm.size();
  std::vector<float> buf(size_t{16} << 20, 1.0f);  // 64 MB: takes a while on loopback
  comm.barrier()->wait();
  if (me == n - 1) {
    auto w = comm.all_reduce(buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
    std::this_thread::sleep_for(5ms);
    std::printf("rank %d: exiting in the middle of all_reduce #1\n", me);
    std::fflush(stdout);
    ::_exit(0);  // no destructors: like a crash, but exit status 0 so zerorun lets the others finish
  }
  const auto start = Clock::now();
  std::string error;
  try {
    comm.all_reduce(buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum)->wait();
    comm.all_reduce(buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum)->wait();
  } catch (const CommError& e) {
    error = std::string("CommError: ") + e.what();
  } catch (const TimeoutError& e) {
    error = std::string("TimeoutError: ") + e.what();
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("rank %d: after %.2f s: %s\n", me, s, error.empty() ? "no error" : error.c_str());
  const bool named = contains(error, "gloo rank " + std::to_string(me) + ": all_reduce(fp32, " +
                                         std::to_string(buf.size()) + ", sum) #");
  const bool in_time = s < std::chrono::duration<double>(comm.default_timeout()).count() + 5;
  // Later calls fail fast.
  bool fast = false;
  try {
    comm.barrier();
  } catch (const CommError& e) {
    fast = contains(e.what(), "failed earlier");
  }
  return named && in_time && fast ? 0 : 1;
}

int mismatch(ProcessGroup& pg) {
  Communicator& comm = *pg.host;
  const int me = comm.rank();
  std::vector<float> buf(2048, 1.0f);
  comm.barrier()->wait();  // #0
  std::string error;
  try {
    if (me == 0) {
      comm.all_reduce(buf.data(), 1024, DType::kFloat32, ReduceOp::kSum)->wait();
    } else if (me == 1) {
      comm.all_gather(buf.data() + 512, buf.data(), 512, DType::kFloat32)->wait();
    } else {
      comm.all_reduce(buf.data(), 1024, DType::kFloat16, ReduceOp::kSum)->wait();
    }
  } catch (const CommError& e) {
    error = e.what();
  }
  std::printf("rank %d: %s\n", me, error.empty() ? "no error" : error.c_str());
  const std::string want =
      "schedule mismatch: rank 0 called all_reduce(fp32, 1024, sum) #1 but rank 1 called "
      "all_gather(fp32, 512) #1";
  return contains(error, want) ? 0 : 1;
}

// Element i of the message from `from` of transfer `k`, a value every dtype holds exactly.
double p2p_value(int from, size_t k, size_t i) { return static_cast<double>((from * 31 + k * 7 + i) % 97); }

int p2p(ProcessGroup& pg, size_t large) {
  Communicator& comm = *pg.host;
  const int me = comm.rank(), n = comm.size();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  size_t checks = 0, failures = 0;
  auto expect = [&](bool ok) {
    ++checks;
    failures += ok ? 0 : 1;
  };
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                          DType::kInt32,   DType::kInt64,   DType::kUInt8};
  size_t k = 0;  // transfer index, the same on every rank
  for (const DType dt : dtypes) {
    for (const size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, large}) {
      // Both ways at once: to the next rank and back to the previous one.
      const size_t es = dtype_size(dt);
      std::vector<uint8_t> out_next(count * es), out_prev(count * es), in_prev(count * es, 0xEE),
          in_next(count * es, 0xEE);
      for (size_t i = 0; i < count; ++i) {
        testing::store_value(dt, out_next.data(), i, p2p_value(me, k, i));
        testing::store_value(dt, out_prev.data(), i, p2p_value(me, k + 1, i));
      }
      if (n == 1) break;
      std::vector<WorkHandle> w;
      w.push_back(comm.recv(in_prev.data(), count, dt, prev));
      w.push_back(comm.recv(in_next.data(), count, dt, next));
      w.push_back(comm.send(out_next.data(), count, dt, next));
      w.push_back(comm.send(out_prev.data(), count, dt, prev));
      for (auto& h : w) h->wait();
      bool ok = true;
      for (size_t i = 0; i < count; ++i) {
        ok &= testing::load_value(dt, in_prev.data(), i) == p2p_value(prev, k, i);
        ok &= testing::load_value(dt, in_next.data(), i) == p2p_value(next, k + 1, i);
      }
      expect(ok);
      k += 2;
    }
  }
  // A stream along the ring: 1000 small messages in flight at once, in order.
  if (n > 1) {
    constexpr int kMessages = 1000;
    std::vector<int32_t> out(kMessages * 3), in(kMessages * 3, -1);
    for (int m = 0; m < kMessages * 3; ++m) out[static_cast<size_t>(m)] = me * 100000 + m;
    std::vector<WorkHandle> w;
    for (int m = 0; m < kMessages; ++m) {
      w.push_back(comm.recv(in.data() + 3 * m, 3, DType::kInt32, prev));
      w.push_back(comm.send(out.data() + 3 * m, 3, DType::kInt32, next));
    }
    for (auto& h : w) h->wait();
    bool ok = true;
    for (int m = 0; m < kMessages * 3; ++m) ok &= in[static_cast<size_t>(m)] == prev * 100000 + m;
    expect(ok);
  }
  comm.barrier()->wait();
  std::printf("rank %d: p2p on %d ranks: %zu checks, %zu failures\n", me, n, checks, failures);
  return failures == 0 && checks > 0 ? 0 : 1;
}

int p2p_mismatch(ProcessGroup& pg) {
  Communicator& comm = *pg.host;
  const int me = comm.rank();
  comm.barrier()->wait();
  if (me > 1) {
    std::printf("rank %d: not involved\n", me);
    return 0;
  }
  std::vector<float> buf(100, 1.0f);
  comm.set_call_label("act");
  const auto start = Clock::now();
  std::string error;
  try {
    (me == 0 ? comm.send(buf.data(), 100, DType::kFloat32, 1) : comm.recv(buf.data(), 99, DType::kFloat32, 0))->wait();
  } catch (const Error& e) {
    error = e.what();
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("rank %d: after %.2f s: %s\n", me, s, error.empty() ? "no error" : error.c_str());
  const std::string want =
      "p2p mismatch: rank 0 called send(fp32, 100, to rank 1) #0 [act] but rank 1 called "
      "recv(fp32, 99, from rank 0) #0 [act]";
  return contains(error, want) && s < std::chrono::duration<double>(comm.default_timeout()).count() / 2 ? 0 : 1;
}

int split(ProcessGroup& pg) {
  Communicator& comm = *pg.host;
  const int me = comm.rank(), n = comm.size();
  auto sub = comm.split(me % 2, me);
  if (!sub) return 1;
  int ok = 1;
  int64_t v = me;
  sub->all_reduce(&v, 1, DType::kInt64, ReduceOp::kSum)->wait();
  int64_t want = 0;
  for (int r = me % 2; r < n; r += 2) want += r;
  ok &= v == want;
  ok &= sub->rank() == me / 2;
  testing::SuiteOptions s;
  s.sizes = {5, 301};
  s.large = 0;
  testing::CheckReport report;
  testing::check_all_collectives(*sub, s, report);
  ok &= report.ok();
  // The parent still works after the split.
  int32_t one = 1;
  comm.all_reduce(&one, 1, DType::kInt32, ReduceOp::kSum)->wait();
  ok &= one == n;
  std::printf("rank %d: split group %d rank %d of %d, sum %lld (want %lld): %s\n", me, me % 2,
              sub->rank(), sub->size(), static_cast<long long>(v), static_cast<long long>(want),
              report.summary().c_str());
  return ok ? 0 : 1;
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gloo_test_worker suite|die|mismatch|split|p2p|p2p-mismatch [--large N]\n");
    return 2;
  }
  const std::string mode = argv[1];
  size_t large = 1000003;
  ProcessGroupOptions o;
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--large") large = std::stoul(argv[i + 1]);
    if (std::string(argv[i]) == "--eager-bytes") o.gloo.eager_bytes = std::stoul(argv[i + 1]);
  }
  // The fault scenarios need failures to surface quickly; the suite has big messages on 2 cores.
  o.timeout = mode == "suite" || mode == "split" || mode == "p2p" ? 60s : 8s;
  ProcessGroup pg = init_process_group(o);
  if (mode == "suite") return suite(pg, large);
  if (mode == "die") return die(pg);
  if (mode == "mismatch") return mismatch(pg);
  if (mode == "split") return split(pg);
  if (mode == "p2p") return p2p(pg, large);
  if (mode == "p2p-mismatch") return p2p_mismatch(pg);
  std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
  return 2;
}

}  // namespace
}  // namespace zero::comm

int main(int argc, char** argv) {
  try {
    return zero::comm::run(argc, argv);
  } catch (const std::exception& e) {
    std::printf("gloo_test_worker: uncaught: %s\n", e.what());
    return 1;
  }
}
