// The runner executes every schedule over real transfers (ranks as threads, Gloo) and computes
// exactly what one rank computing the micro-batches one after another computes: a chain of
// elementwise affine stages y = a_k x + b_k with loss 0.5 |y|^2 on the last, every loss and every
// parameter gradient bit for bit (the gradients are summed in micro-batch order under every
// schedule). A stage function that throws ends its rank with the action and the micro-batch named,
// and the other ranks at once.
#include "parallel/pipeline/runner.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "parallel/pipeline/schedules.h"
#include "testing/thread_ranks.h"

namespace zero::parallel {
namespace {

constexpr size_t kWidth = 5;

float a_of(int k) { return 1.0f + 0.1f * static_cast<float>(k); }
float b_of(int k) { return 0.01f * static_cast<float>(k + 1); }
std::vector<float> input_of(int mb) {
  std::vector<float> x(kWidth);
  for (size_t j = 0; j < kWidth; ++j) x[j] = 0.1f * static_cast<float>(mb + 1) + 0.01f * static_cast<float>(j);
  return x;
}

// Per virtual stage: the gradients of a and b; per micro-batch: the loss.
struct Grads {
  std::map<int, float> da, db;
  std::map<int, float> loss;
};

// One micro-batch after another through all V stages.
Grads reference(int stages, int microbatches) {
  Grads g;
  for (int mb = 0; mb < microbatches; ++mb) {
    std::vector<std::vector<float>> xs;
    std::vector<float> x = input_of(mb);
    for (int k = 0; k < stages; ++k) {
      xs.push_back(x);
      for (float& v : x) v = a_of(k) * v + b_of(k);
    }
    float loss = 0;
    for (float v : x) loss += 0.5f * v * v;
    g.loss[mb] = loss;
    std::vector<float> dy = x;
    for (int k = stages - 1; k >= 0; --k) {
      for (size_t j = 0; j < kWidth; ++j) {
        g.da[k] += dy[j] * xs[static_cast<size_t>(k)][j];
        g.db[k] += dy[j];
      }
      for (float& v : dy) v *= a_of(k);
    }
  }
  return g;
}

// This rank's stage functions over the same chain, recording into `g`.
std::vector<float> values(const StageTensor& t) {
  const std::span<const float> v = t.span<float>();
  return {v.begin(), v.end()};
}

struct Stages {
  const Schedule& s;
  int rank;
  Grads& g;
  std::map<std::pair<int, int>, std::vector<float>> x, dy;  // per (mb, chunk): input, output gradient
  std::map<std::pair<int, int>, std::vector<float>> y_last;
  int throw_at_mb = -1;

  StageFunctions functions() {
    StageFunctions f;
    f.forward = [this](int mb, int chunk, const StageTensor& in, StageTensor& out) {
      if (mb == throw_at_mb) throw std::runtime_error("boom");
      const int k = s.virtual_stage(rank, chunk);
      std::vector<float> y = k == 0 ? input_of(mb) : values(in);
      x[{mb, chunk}] = y;
      for (float& v : y) v = a_of(k) * v + b_of(k);
      if (k == s.virtual_stages() - 1) {
        CHECK(out.empty());
        float loss = 0;
        for (float v : y) loss += 0.5f * v * v;
        g.loss[mb] = loss;
        y_last[{mb, chunk}] = y;
      } else {
        REQUIRE(out.numel() == kWidth);
        std::copy(y.begin(), y.end(), out.span<float>().begin());
      }
    };
    f.backward = [this](int mb, int chunk, bool with_weight, const StageTensor& grad_out, StageTensor& grad_in) {
      const int k = s.virtual_stage(rank, chunk);
      const std::vector<float> d = k == s.virtual_stages() - 1 ? y_last.at({mb, chunk}) : values(grad_out);
      dy[{mb, chunk}] = d;
      if (k > 0) {
        for (size_t j = 0; j < kWidth; ++j) grad_in.span<float>()[j] = d[j] * a_of(k);
      } else {
        CHECK(grad_in.empty());
      }
      if (with_weight) weight(mb, chunk);
    };
    f.weight = [this](int mb, int chunk) { weight(mb, chunk); };
    return f;
  }

  void weight(int mb, int chunk) {
    const int k = s.virtual_stage(rank, chunk);
    const std::vector<float>& d = dy.at({mb, chunk});
    const std::vector<float>& in = x.at({mb, chunk});
    for (size_t j = 0; j < kWidth; ++j) {
      g.da[k] += d[j] * in[j];
      g.db[k] += d[j];
    }
  }
};

TEST_CASE("every schedule computes, over real transfers, exactly what one rank computes") {
  for (int p : {2, 3, 4}) {
    for (const char* name : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
      const int chunks = std::string(name) == "interleaved" ? 2 : 1;
      const int m = 2 * p;
      const Schedule s = make_schedule(name, p, m, chunks);
      const Grads want = reference(p * chunks, m);
      CAPTURE(p);
      CAPTURE(name);
      std::mutex mu;
      Grads got;
      testing::run_thread_ranks(p, [&](comm::Communicator& comm) {
        Grads mine;
        Stages stages{s, comm.rank(), mine};
        PipelineRunner runner(s, comm.rank(), comm, [](int, int) { return TensorSpec{kWidth}; });
        const std::vector<Span> spans = runner.run(stages.functions());
        size_t compute = 0;
        for (const Action& a : s.actions[static_cast<size_t>(comm.rank())]) compute += is_compute(a.op);
        CHECK(spans.size() == compute);
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& [k, v] : mine.da) got.da[k] = v;
        for (const auto& [k, v] : mine.db) got.db[k] = v;
        for (const auto& [mb, v] : mine.loss) got.loss[mb] = v;
      });
      CHECK(got.loss == want.loss);
      CHECK(got.da == want.da);
      CHECK(got.db == want.db);
    }
  }
}

TEST_CASE("a stage function that throws ends its rank naming the action, and the others at once") {
  const Schedule s = one_f_one_b(3, 6);
  const auto start = std::chrono::steady_clock::now();
  testing::run_thread_ranks(
      3,
      [&](comm::Communicator& comm) {
        Grads mine;
        Stages stages{s, comm.rank(), mine};
        if (comm.rank() == 1) stages.throw_at_mb = 2;
        PipelineRunner runner(s, comm.rank(), comm, [](int, int) { return TensorSpec{kWidth}; });
        try {
          runner.run(stages.functions());
          FAIL("the step completed");
        } catch (const Error& e) {
          if (comm.rank() == 1) {
            CHECK(std::string(e.what()) == "pipeline rank 1: F of micro-batch 2 failed: boom");
          } else {
            CHECK(std::string(e.what()).find("pipeline rank " + std::to_string(comm.rank())) != std::string::npos);
          }
        }
      },
      std::chrono::seconds(20));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("a schedule that splits the backward refuses stage functions without a weight function, naming it") {
  const Schedule s = zb_h1(2, 4);
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    Grads mine;
    Stages stages{s, comm.rank(), mine};
    StageFunctions f = stages.functions();
    f.weight = nullptr;
    PipelineRunner runner(s, comm.rank(), comm, [](int, int) { return TensorSpec{kWidth}; });
    CHECK_THROWS_WITH_AS(runner.run(f),
                         "pipeline stage functions: the schedule 'zb-h1' splits the backward into B and W but no "
                         "weight function was given (StageFunctions::weight)",
                         InvalidArgument);
  });
}

}  // namespace
}  // namespace zero::parallel
