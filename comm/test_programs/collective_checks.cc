#include "comm/test_programs/collective_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>

#include "base/dtype.h"

namespace zero::comm::testing {

void CheckReport::fail(std::string message) {
  if (failures.size() < 50) failures.push_back(std::move(message));
}

std::string CheckReport::summary() const {
  std::string s = fmt::format("{} checks, {} failures", checks, failures.size());
  for (const auto& f : failures) s += "\n  " + f;
  return s;
}

namespace {

const DType kReduceTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                              DType::kFloat64, DType::kInt32,   DType::kInt64};
const DType kMoveTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                            DType::kInt32,   DType::kInt64,   DType::kUInt8};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

// Small integers, different per rank, element and check (salt); non-negative for uint8.
double value(DType t, int rank, size_t i, uint64_t salt) {
  const auto v = static_cast<double>((i * 7 + static_cast<size_t>(rank) * 13 + salt) % 11);
  return t == DType::kUInt8 ? v : v - 5.0;
}

}  // namespace

void store_value(DType t, void* base, size_t i, double x) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(x); break;
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[i] = fp32_to_fp16_bits(static_cast<float>(x));
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[i] = fp32_to_bf16_bits(static_cast<float>(x));
      break;
    case DType::kFloat64: static_cast<double*>(base)[i] = x; break;
    case DType::kInt32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(x); break;
    case DType::kInt64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(x); break;
    case DType::kUInt8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(x); break;
  }
}

double load_value(DType t, const void* base, size_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kFloat16: return fp16_bits_to_fp32(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16: return bf16_bits_to_fp32(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat64: return static_cast<const double*>(base)[i];
    case DType::kInt32: return static_cast<const int32_t*>(base)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::kUInt8: return static_cast<const uint8_t*>(base)[i];
  }
  return NAN;
}

namespace {

// Expected reduction of the n sources' values (exact integers) as the backend must produce it.
double reduce_expected(DType t, ReduceOp op, const std::vector<double>& v) {
  double sum = 0, mx = v[0], mn = v[0];
  for (double x : v) {
    sum += x;
    mx = std::max(mx, x);
    mn = std::min(mn, x);
  }
  const auto n = static_cast<double>(v.size());
  switch (op) {
    case ReduceOp::kSum: return sum;
    case ReduceOp::kMax: return mx;
    case ReduceOp::kMin: return mn;
    case ReduceOp::kAvg:
      switch (t) {
        case DType::kFloat32:
        case DType::kFloat16:
        case DType::kBFloat16: return static_cast<float>(sum) / static_cast<float>(n);
        case DType::kFloat64: return sum / n;
        default: return std::trunc(sum / n);
      }
  }
  return NAN;
}

struct Buffer {
  explicit Buffer(size_t bytes) : data(std::make_unique<uint64_t[]>(bytes / 8 + 1)) {}
  uint8_t* bytes() { return reinterpret_cast<uint8_t*>(data.get()); }
  std::unique_ptr<uint64_t[]> data;  // 8-byte aligned for every dtype
};

// Compares `got` with `expected(i)` bit for bit for i < count.
void verify(CheckReport& report, const std::string& what, DType t, const void* got, size_t count,
            const std::function<double(size_t)>& expected) {
  ++report.checks;
  const size_t es = dtype_size(t);
  uint64_t want_bits = 0;
  int reported = 0;
  for (size_t i = 0; i < count; ++i) {
    const double want = expected(i);
    store_value(t, &want_bits, 0, want);
    if (std::memcmp(static_cast<const uint8_t*>(got) + i * es, &want_bits, es) != 0) {
      report.fail(fmt::format("{}: element {} is {} but expected {}", what, i,
                              load_value(t, got, i), want));
      if (++reported == 3) return;
    }
  }
}

// A collective issued now and verified after a later wait (batched issue).
struct Pending {
  WorkHandle work;
  std::function<void()> check;
  std::vector<std::shared_ptr<Buffer>> keep;
  size_t bytes = 0;
};

class Runner {
 public:
  Runner(Communicator& comm, const SuiteOptions& options, CheckReport& report)
      : comm_(comm), options_(options), report_(report) {}

  ~Runner() { flush(); }

  void add(Pending p) {
    bytes_ += p.bytes;
    pending_.push_back(std::move(p));
    if (!options_.batched || pending_.size() >= 8 || bytes_ > (size_t{64} << 20)) flush();
  }

  void flush() {
    for (auto& p : pending_) {
      try {
        p.work->wait();
        p.check();
      } catch (const std::exception& e) {
        report_.fail(fmt::format("rank {}: exception: {}", comm_.rank(), e.what()));
      }
    }
    pending_.clear();
    bytes_ = 0;
  }

  uint64_t next_salt() { return salt_++; }

 private:
  Communicator& comm_;
  const SuiteOptions& options_;
  CheckReport& report_;
  std::vector<Pending> pending_;
  size_t bytes_ = 0;
  uint64_t salt_ = 1;
};

void all_reduce_check(Runner& run, Communicator& comm, CheckReport& report, DType t, ReduceOp op,
                      size_t count) {
  const int me = comm.rank(), n = comm.size();
  const uint64_t salt = run.next_salt();
  auto buf = std::make_shared<Buffer>(count * dtype_size(t));
  for (size_t i = 0; i < count; ++i) store_value(t, buf->bytes(), i, value(t, me, i, salt));
  Pending p;
  p.work = comm.all_reduce(buf->bytes(), count, t, op);
  p.bytes = count * dtype_size(t);
  p.keep = {buf};
  p.check = [&report, buf, t, op, count, me, n, salt] {
    verify(report,
           fmt::format("rank {}: all_reduce {} {} n={}", me, dtype_name(t), reduce_op_name(op),
                       count),
           t, buf->bytes(), count, [&](size_t i) {
             std::vector<double> v;
             for (int r = 0; r < n; ++r) v.push_back(value(t, r, i, salt));
             return reduce_expected(t, op, v);
           });
  };
  run.add(std::move(p));
}

void reduce_scatter_check(Runner& run, Communicator& comm, CheckReport& report, DType t,
                          ReduceOp op, size_t count, bool in_place) {
  const int me = comm.rank(), n = comm.size();
  const size_t es = dtype_size(t);
  const uint64_t salt = run.next_salt();
  auto send = std::make_shared<Buffer>(n * count * es);
  for (size_t i = 0; i < n * count; ++i) store_value(t, send->bytes(), i, value(t, me, i, salt));
  auto recv = in_place ? send : std::make_shared<Buffer>(count * es);
  uint8_t* out = in_place ? send->bytes() + me * count * es : recv->bytes();
  Pending p;
  p.work = comm.reduce_scatter(send->bytes(), out, count, t, op);
  p.bytes = (n + 1) * count * es;
  p.keep = {send, recv};
  p.check = [&report, send, recv, out, t, op, count, me, n, salt, in_place] {
    verify(report,
           fmt::format("rank {}: reduce_scatter {} {} n={} {}", me, dtype_name(t),
                       reduce_op_name(op), count, in_place ? "in place" : "out of place"),
           t, out, count, [&](size_t i) {
             std::vector<double> v;
             for (int r = 0; r < n; ++r) v.push_back(value(t, r, me * count + i, salt));
             return reduce_expected(t, op, v);
           });
  };
  run.add(std::move(p));
}

void all_gather_check(Runner& run, Communicator& comm, CheckReport& report, DType t, size_t count,
                      bool in_place) {
  const int me = comm.rank(), n = comm.size();
  const size_t es = dtype_size(t);
  const uint64_t salt = run.next_salt();
  auto recv = std::make_shared<Buffer>(n * count * es);
  // Garbage where the peers' chunks will land.
  for (size_t i = 0; i < n * count; ++i) store_value(t, recv->bytes(), i, 99);
  auto send = in_place ? recv : std::make_shared<Buffer>(count * es);
  uint8_t* in = in_place ? recv->bytes() + me * count * es : send->bytes();
  for (size_t i = 0; i < count; ++i) store_value(t, in, i, value(t, me, i, salt));
  Pending p;
  p.work = comm.all_gather(in, recv->bytes(), count, t);
  p.bytes = (n + 1) * count * es;
  p.keep = {send, recv};
  p.check = [&report, recv, t, count, me, salt, n, in_place] {
    verify(report,
           fmt::format("rank {}: all_gather {} n={} {}", me, dtype_name(t), count,
                       in_place ? "in place" : "out of place"),
           t, recv->bytes(), n * count,
           [&](size_t i) { return value(t, static_cast<int>(i / count), i % count, salt); });
  };
  run.add(std::move(p));
}

void broadcast_check(Runner& run, Communicator& comm, CheckReport& report, DType t, size_t count,
                     int root) {
  const int me = comm.rank();
  const uint64_t salt = run.next_salt();
  auto buf = std::make_shared<Buffer>(count * dtype_size(t));
  for (size_t i = 0; i < count; ++i) {
    store_value(t, buf->bytes(), i, me == root ? value(t, root, i, salt) : 77);
  }
  Pending p;
  p.work = comm.broadcast(buf->bytes(), count, t, root);
  p.bytes = count * dtype_size(t);
  p.keep = {buf};
  p.check = [&report, buf, t, count, me, root, salt] {
    verify(report,
           fmt::format("rank {}: broadcast {} n={} root {}", me, dtype_name(t), count, root), t,
           buf->bytes(), count, [&](size_t i) { return value(t, root, i, salt); });
  };
  run.add(std::move(p));
}

void all_to_all_check(Runner& run, Communicator& comm, CheckReport& report, DType t,
                      size_t count) {
  const int me = comm.rank(), n = comm.size();
  const size_t es = dtype_size(t);
  const uint64_t salt = run.next_salt();
  auto send = std::make_shared<Buffer>(n * count * es);
  auto recv = std::make_shared<Buffer>(n * count * es);
  for (size_t i = 0; i < n * count; ++i) store_value(t, send->bytes(), i, value(t, me, i, salt));
  Pending p;
  p.work = comm.all_to_all(send->bytes(), recv->bytes(), count, t);
  p.bytes = 2 * n * count * es;
  p.keep = {send, recv};
  p.check = [&report, recv, t, count, me, n, salt] {
    verify(report, fmt::format("rank {}: all_to_all {} n={}", me, dtype_name(t), count), t,
           recv->bytes(), n * count, [&](size_t i) {
             const int from = static_cast<int>(i / count);
             return value(t, from, me * count + i % count, salt);
           });
  };
  run.add(std::move(p));
}

}  // namespace

void check_all_collectives(Communicator& comm, const SuiteOptions& options, CheckReport& report) {
  Runner run(comm, options, report);
  const int n = comm.size();
  for (size_t count : options.sizes) {
    for (DType t : kReduceTypes) {
      for (ReduceOp op : kOps) {
        all_reduce_check(run, comm, report, t, op, count);
        reduce_scatter_check(run, comm, report, t, op, count, /*in_place=*/true);
        reduce_scatter_check(run, comm, report, t, op, count, /*in_place=*/false);
      }
    }
    for (DType t : kMoveTypes) {
      all_gather_check(run, comm, report, t, count, true);
      all_gather_check(run, comm, report, t, count, false);
      for (int root = 0; root < n; ++root) broadcast_check(run, comm, report, t, count, root);
      all_to_all_check(run, comm, report, t, count);
    }
    run.add(Pending{comm.barrier(), [&report] { ++report.checks; }, {}, 0});
  }
  if (options.large > 0) {
    // The per-rank chunk of the large reduce-scatter / all-gather is odd as well.
    const size_t chunk = (options.large / static_cast<size_t>(n)) | 1;
    for (DType t : kReduceTypes) {
      all_reduce_check(run, comm, report, t, ReduceOp::kSum, options.large);
      reduce_scatter_check(run, comm, report, t, ReduceOp::kSum, chunk, true);
    }
    all_reduce_check(run, comm, report, DType::kFloat32, ReduceOp::kAvg, options.large);
    all_reduce_check(run, comm, report, DType::kFloat16, ReduceOp::kMax, options.large);
    reduce_scatter_check(run, comm, report, DType::kBFloat16, ReduceOp::kAvg, chunk, false);
    all_gather_check(run, comm, report, DType::kFloat32, chunk, true);
    all_gather_check(run, comm, report, DType::kFloat16, chunk, false);
    broadcast_check(run, comm, report, DType::kFloat32, options.large, n - 1);
  }
  run.flush();
}

void check_fp16_accumulation(Communicator& comm, CheckReport& report) {
  const int me = comm.rank(), n = comm.size();
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    // 2048 in fp16 and 256 in bf16 sit where the spacing is 2: 2048 + 1 rounds back to 2048.
    const float big = t == DType::kFloat16 ? 2048.0f : 256.0f;
    const size_t count = 37;
    std::vector<uint16_t> buf(count);
    for (size_t i = 0; i < count; ++i) store_value(t, buf.data(), i, me == 0 ? big : 1.0);
    std::vector<uint16_t> rs(static_cast<size_t>(n) * count);
    for (size_t i = 0; i < rs.size(); ++i) store_value(t, rs.data(), i, me == 0 ? big : 1.0);
    std::vector<uint16_t> rs_out(count);
    try {
      comm.all_reduce(buf.data(), count, t, ReduceOp::kSum)->wait();
      comm.reduce_scatter(rs.data(), rs_out.data(), count, t, ReduceOp::kSum)->wait();
    } catch (const std::exception& e) {
      report.fail(fmt::format("rank {}: fp32 accumulation: exception: {}", me, e.what()));
      return;
    }
    // fp32 sum rounded once to the 16-bit type.
    const double want = big + static_cast<double>(n - 1);
    verify(report,
           fmt::format("rank {}: all_reduce {} sum accumulates in fp32", me, dtype_name(t)), t,
           buf.data(), count, [&](size_t) { return want; });
    verify(report,
           fmt::format("rank {}: reduce_scatter {} sum accumulates in fp32", me, dtype_name(t)),
           t, rs_out.data(), count, [&](size_t) { return want; });
    if (n >= 3) {
      // And that differs from what a 16-bit accumulator gives (so the check can fail).
      uint16_t acc = 0, want_bits = 0;
      store_value(t, &acc, 0, big);
      for (int r = 1; r < n; ++r) store_value(t, &acc, 0, load_value(t, &acc, 0) + 1.0);
      store_value(t, &want_bits, 0, want);
      ++report.checks;
      if (acc == want_bits) report.fail("fp16 accumulation check cannot tell fp16 from fp32");
    }
  }
}

}  // namespace zero::comm::testing
