// NCCL backend. Without a GPU (every CPU build, and CUDA builds on machines without a driver) it
// prints ZERO_TEST_SKIPPED. With one GPU it runs world size 1; the 2-rank cases (one thread per
// GPU, one MemoryStore) need two devices and are skipped otherwise.
#include "comm/nccl/nccl_communicator.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/store/memory_store.h"
#include "comm/test_programs/collective_checks.h"

#ifdef ZERO_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace zero::comm {
namespace {

bool skip_without(int devices, const char* what) {
  if (cuda_device_count() >= devices) return false;
  std::printf("ZERO_TEST_SKIPPED: %s needs %d CUDA device(s), %d visible (%s build)\n", what,
              devices, cuda_device_count(), nccl_built() ? "CUDA" : "CPU");
  return true;
}

#ifdef ZERO_WITH_CUDA

void cuda_ok(cudaError_t e) { REQUIRE_MESSAGE(e == cudaSuccess, cudaGetErrorString(e)); }

// Device memory holding a copy of a host range.
struct DeviceCopy {
  DeviceCopy(const void* host, size_t bytes) : bytes(bytes) {
    cuda_ok(cudaMalloc(&ptr, bytes + 1));
    if (host && bytes) cuda_ok(cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice));
  }
  ~DeviceCopy() { cudaFree(ptr); }
  void to_host(void* host) const {
    if (bytes) cuda_ok(cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost));
  }
  uint8_t* at(size_t offset) const { return static_cast<uint8_t*>(ptr) + offset; }
  void* ptr = nullptr;
  size_t bytes;
};

class DoneWork final : public Work {
 public:
  void wait(std::chrono::milliseconds) override {}
  void wait() override {}
  bool is_completed() override { return true; }
};

// Runs the host-buffer checks of comm/test_programs/collective_checks.h through the real NCCL communicator:
// each call copies its host buffers to the device (keeping in-place layouts in place), runs the
// collective there, waits, and copies the results back.
class DeviceStaging final : public Communicator {
 public:
  explicit DeviceStaging(Communicator& nccl) : nccl_(nccl) {}
  int rank() const override { return nccl_.rank(); }
  int size() const override { return nccl_.size(); }
  std::string backend_name() const override { return "nccl (staged)"; }
  std::chrono::milliseconds default_timeout() const override { return nccl_.default_timeout(); }

  WorkHandle all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    DeviceCopy d(buf, count * dtype_size(t));
    nccl_.all_reduce(d.ptr, count, t, op)->wait();
    d.to_host(buf);
    return done();
  }
  WorkHandle reduce_scatter(const void* send, void* recv, size_t count, DType t,
                            ReduceOp op) override {
    const size_t b = count * dtype_size(t);
    DeviceCopy s(send, b * size());
    const bool in_place = recv == static_cast<const uint8_t*>(send) + rank() * b;
    DeviceCopy r(nullptr, in_place ? 0 : b);
    void* out = in_place ? s.at(rank() * b) : r.ptr;
    nccl_.reduce_scatter(s.ptr, out, count, t, op)->wait();
    if (b) cuda_ok(cudaMemcpy(recv, out, b, cudaMemcpyDeviceToHost));
    return done();
  }
  WorkHandle all_gather(const void* send, void* recv, size_t count, DType t) override {
    const size_t b = count * dtype_size(t);
    DeviceCopy r(recv, b * size());
    const bool in_place = send == static_cast<uint8_t*>(recv) + rank() * b;
    DeviceCopy s(send, in_place ? 0 : b);
    nccl_.all_gather(in_place ? r.at(rank() * b) : s.ptr, r.ptr, count, t)->wait();
    r.to_host(recv);
    return done();
  }
  WorkHandle broadcast(void* buf, size_t count, DType t, int root) override {
    DeviceCopy d(buf, count * dtype_size(t));
    nccl_.broadcast(d.ptr, count, t, root)->wait();
    d.to_host(buf);
    return done();
  }
  WorkHandle all_to_all(const void* send, void* recv, size_t count, DType t) override {
    const size_t b = count * dtype_size(t) * size();
    DeviceCopy s(send, b), r(nullptr, b);
    nccl_.all_to_all(s.ptr, r.ptr, count, t)->wait();
    r.to_host(recv);
    return done();
  }
  WorkHandle barrier() override {
    nccl_.barrier()->wait();
    return done();
  }
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }

 private:
  static WorkHandle done() { return std::make_shared<DoneWork>(); }
  Communicator& nccl_;
};

void run_ranks(int size, const std::function<void(int, Communicator&)>& fn, bool check_every_call = false) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions o;
      o.device = r;
      o.timeout = std::chrono::seconds(60);
      o.check_every_call = check_every_call;
      auto comm = make_nccl_communicator(store, r, size, o);
      fn(r, *comm);
    });
  }
  for (auto& t : threads) t.join();
}

void check_suite(Communicator& nccl) {
  DeviceStaging staged(nccl);
  testing::SuiteOptions s;
  s.sizes = {1, 7, 1000};
  s.large = 100003;
  s.batched = false;
  testing::CheckReport report;
  testing::check_all_collectives(staged, s, report);
  CHECK_MESSAGE(report.ok(), report.summary());
}

#endif  // ZERO_WITH_CUDA

TEST_CASE("NCCL on one GPU: every collective and dtype, split, stream ordering") {
  if (skip_without(1, "NCCL world size 1")) return;
#ifdef ZERO_WITH_CUDA
  run_ranks(1, [](int, Communicator& comm) {
    CHECK(comm.backend_name() == "nccl");
    check_suite(comm);
    // wait_stream orders a stream after the collective without blocking the host.
    float* d = nullptr;
    cuda_ok(cudaMalloc(&d, 4 * sizeof(float)));
    const float h[4] = {1, 2, 3, 4};
    cuda_ok(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
    cudaStream_t s;
    cuda_ok(cudaStreamCreate(&s));
    comm.all_reduce(d, 4, DType::kFloat32, ReduceOp::kMax)->wait_stream(s);
    float back[4] = {};
    cuda_ok(cudaMemcpyAsync(back, d, sizeof back, cudaMemcpyDeviceToHost, s));
    cuda_ok(cudaStreamSynchronize(s));
    CHECK(back[3] == 4.0f);
    cudaStreamDestroy(s);
    cudaFree(d);
    auto sub = comm.split(0, 0);
    REQUIRE(sub);
    CHECK(sub->size() == 1);
    CHECK(comm.split(-1, 0) == nullptr);
    comm.verify_schedule();  // one rank agrees with itself
    // Validation happens before anything is enqueued.
    CHECK_THROWS_AS(comm.broadcast(nullptr, 3, DType::kFloat32, 0), InvalidArgument);
    CHECK_THROWS_AS(comm.broadcast(back, 3, DType::kFloat32, 1), InvalidArgument);
  });
#endif
}

TEST_CASE("NCCL on two GPUs: collectives and a reported schedule mismatch, per call and deferred") {
  if (skip_without(2, "NCCL world size 2")) return;
#ifdef ZERO_WITH_CUDA
  run_ranks(2, [](int, Communicator& comm) { check_suite(comm); });
  run_ranks(2, [](int rank, Communicator& comm) {
    float* d = nullptr;
    cuda_ok(cudaMalloc(&d, 2048 * sizeof(float)));
    try {
      if (rank == 0) {
        comm.all_reduce(d, 1024, DType::kFloat32, ReduceOp::kSum)->wait();
      } else {
        comm.all_gather(d + 512, d, 512, DType::kFloat32)->wait();
      }
      FAIL("mismatch not reported");
    } catch (const CommError& e) {
      CHECK(std::string(e.what()).find("schedule mismatch: rank 0 called all_reduce(fp32, 1024, "
                                       "sum) #0 but rank 1 called all_gather(fp32, 512) #0") !=
            std::string::npos);
    }
    cudaFree(d);
  }, /*check_every_call=*/true);
  // The deferred check: calls of one shape made for different purposes run, and the step's end
  // (verify_schedule) names both; calls that agree pass it.
  run_ranks(2, [](int rank, Communicator& comm) {
    float* d = nullptr;
    cuda_ok(cudaMalloc(&d, 1024 * sizeof(float)));
    comm.all_reduce(d, 1024, DType::kFloat32, ReduceOp::kSum)->wait();
    comm.verify_schedule();
    comm.set_call_label(rank == 0 ? "unit 3 forward" : "unit 4 forward");
    comm.all_reduce(d, 1024, DType::kFloat32, ReduceOp::kSum)->wait();
    try {
      comm.verify_schedule();
      FAIL("mismatch not reported");
    } catch (const CommError& e) {
      CHECK(std::string(e.what()).find("schedule mismatch: rank 0 called all_reduce(fp32, 1024, sum) #1 [unit 3 "
                                       "forward] but rank 1 called all_reduce(fp32, 1024, sum) #1 [unit 4 forward]") !=
            std::string::npos);
    }
    cudaFree(d);
  });
#endif
}

TEST_CASE("NCCL on two GPUs: a send and a receive at once, both ways, in one group") {
  if (skip_without(2, "NCCL point-to-point")) return;
#ifdef ZERO_WITH_CUDA
  run_ranks(2, [](int rank, Communicator& comm) {
    constexpr size_t kCount = size_t{8} << 20;  // larger than NCCL's buffers: ungrouped, it would block
    std::vector<float> h(kCount, static_cast<float>(rank + 1));
    DeviceCopy out(h.data(), kCount * sizeof(float)), in(nullptr, kCount * sizeof(float));
    WorkHandle s = comm.send(out.ptr, kCount, DType::kFloat32, 1 - rank);
    WorkHandle r = comm.recv(in.ptr, kCount, DType::kFloat32, 1 - rank);
    r->wait();
    s->wait();
    in.to_host(h.data());
    CHECK(h[0] == static_cast<float>(2 - rank));
    CHECK(h[kCount - 1] == static_cast<float>(2 - rank));
    CHECK_THROWS_AS(comm.send(out.ptr, 1, DType::kFloat32, rank), InvalidArgument);
  });
#endif
}

TEST_CASE("NCCL on two GPUs: a receive of another count ends both ranks within the timeout") {
  if (skip_without(2, "NCCL point-to-point pairing")) return;
#ifdef ZERO_WITH_CUDA
  // Rank 1 receives one element more than rank 0 sends. NCCL itself does not pair the calls; the
  // stall check names them once a transfer has waited, when both ranks' transfers stall. Where
  // only the receive stalls, it ends at the timeout instead. Either way nobody hangs.
  constexpr auto kTimeout = std::chrono::seconds(60);
  run_ranks(2, [&](int rank, Communicator& comm) {
    constexpr size_t kCount = size_t{8} << 20;
    DeviceCopy buf(nullptr, (kCount + 1) * sizeof(float));
    comm.set_call_label("act");
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    try {
      (rank == 0 ? comm.send(buf.ptr, kCount, DType::kFloat32, 1)
                 : comm.recv(buf.ptr, kCount + 1, DType::kFloat32, 0))
          ->wait();
    } catch (const Error& e) {
      error = e.what();
    }
    CHECK(std::chrono::steady_clock::now() - start < kTimeout + std::chrono::seconds(10));
    if (error.find("p2p mismatch") != std::string::npos) {
      CHECK(error.find("p2p mismatch: rank 0 called send(fp32, 8388608, to rank 1) #0 [act] but rank 1 "
                       "called recv(fp32, 8388609, from rank 0) #0 [act]") != std::string::npos);
    }
    if (rank == 1) CHECK_FALSE(error.empty());  // the receive cannot complete
  });
#endif
}

TEST_CASE("the NCCL API answers in every build") {
  NcclOptions o;
  o.timeout = std::chrono::milliseconds(0);
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("timeout"), InvalidArgument);
  if (!nccl_built()) {
    CHECK_FALSE(nccl_available());
    CHECK_THROWS_AS(make_nccl_communicator(std::make_shared<MemoryStore>(), 0, 1),
                    InvalidArgument);
  }
}

}  // namespace
}  // namespace zero::comm
