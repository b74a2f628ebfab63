// Stage 3's quantized gathers (EngineOptions.quantized_weights, ZeRO++'s qwZ) on thread ranks: what a
// scope reads is within half a block's scale of the full-precision parameter, every rank reads the
// same values, the backward reads full precision unless asked, two runs are bitwise equal, offload
// works, the bytes gathered shrink, and a non-finite parameter stops every rank naming it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "testing/thread_ranks.h"
#include "testing/unit_model.h"
#include "zero/engine.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

const std::vector<size_t> kSizes = {3000, 700, 257, 40};

struct Config {
  int bits = 8;  // 0: full precision
  bool backward = true;
  bool offload = false;
  int steps = 3;
  bool nan = false;  // one registered value of unit 1 is NaN (forward-only steps then)
};

struct Result {
  std::vector<std::vector<float>> forward, backward;  // what the last step's scopes read, per unit
  std::vector<std::vector<float>> initial;
  uint64_t gathered_bytes = 0;                        // the last step's
};

Result train(comm::Communicator& comm, const Config& c) {
  EngineOptions opt;
  opt.stage = 3;
  opt.optimizer.kind = optim::OptimizerKind::kAdamW;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
  opt.deterministic = true;
  opt.timeout = 30s;
  opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 64};
  opt.quantized_weights = {.bits = c.bits, .block = 64, .backward = c.backward};
  opt.offload.optimizer = opt.offload.params = c.offload;
  Engine engine(comm, opt);
  Result r;
  testing::UnitModel model(engine, kSizes, [&](size_t u, size_t e) {
    if (c.nan && u == 1 && e == 5) return std::numeric_limits<float>::quiet_NaN();
    return std::sin(0.37f * static_cast<float>(e) + static_cast<float>(u)) * (e % 97 == 0 ? 3.0f : 0.05f);
  });
  r.initial = model.initial();
  engine.finalize();
  for (int step = 0; step < c.steps; ++step) {
    testing::UnitModel::Backward backward;
    if (!c.nan) {
      backward = [&](size_t u, const std::vector<float>& read, float* g) {
        for (size_t e = 0; e < kSizes[u]; ++e) {
          g[e] += 0.01f * std::cos(0.1f * static_cast<float>(e) + static_cast<float>(comm.rank() + step)) + 0.1f * read[e];
        }
      };
    }
    const testing::UnitReads reads = model.gather_step(backward);
    r.forward = reads.forward;
    r.backward = reads.backward;
    engine.step();
    r.gathered_bytes = engine.step_timings().gathered_bytes;
  }
  return r;
}

// Every rank's result; a rank's error fails the test with its message, or is collected in `errors`.
std::vector<Result> run(int world, const Config& c, std::vector<std::string>* errors = nullptr) {
  std::vector<std::string> own;
  std::vector<Result> out = testing::thread_rank_results<Result>(
      world, [&](comm::Communicator& comm) { return train(comm, c); }, errors != nullptr ? *errors : own);
  for (const std::string& e : own) FAIL_CHECK(e);
  return out;
}

// The largest |x| of a unit: each block's scale is at most this / qmax.
float absmax(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

TEST_CASE("qwZ: a scope reads each value within half a scale, every rank the same; the backward as asked") {
  for (int world : {1, 2, 3}) {
    for (int bits : {8, 4}) {
      for (bool backward : {true, false}) {
        CAPTURE(world);
        CAPTURE(bits);
        CAPTURE(backward);
        const std::vector<Result> rs = run(world, {.bits = bits, .backward = backward, .steps = 1});
        const Result& r = rs[0];
        const float qmax = bits == 8 ? 127.0f : 7.0f;
        size_t changed = 0;
        for (size_t u = 0; u < kSizes.size(); ++u) {
          CAPTURE(u);
          const float bound = absmax(r.initial[u]) / qmax / 2 * (1 + 1e-6f);
          for (size_t e = 0; e < kSizes[u]; ++e) {
            CHECK(std::fabs(r.forward[u][e] - r.initial[u][e]) <= bound);
            changed += r.forward[u][e] != r.initial[u][e] ? 1 : 0;
          }
          // The backward (before any update): quantized as the forward, or the full-precision values.
          CHECK(r.backward[u] == (backward ? r.forward[u] : r.initial[u]));
          for (const Result& other : rs) {
            CHECK(other.forward[u] == r.forward[u]);
            CHECK(other.backward[u] == r.backward[u]);
          }
        }
        CHECK(changed > 0);
      }
    }
  }
}

TEST_CASE("qwZ: two runs are bitwise equal, training stays near full precision, offload too, fewer bytes") {
  for (bool offload : {false, true}) {
    CAPTURE(offload);
    const Result a = run(2, {.bits = 8, .offload = offload})[0], b = run(2, {.bits = 8, .offload = offload})[0];
    CHECK(a.forward == b.forward);
    CHECK(a.backward == b.backward);
    const Result full = run(2, {.bits = 0, .offload = offload})[0];
    for (size_t u = 0; u < kSizes.size(); ++u) {
      CAPTURE(u);
      // What the last step read, after two updates: AdamW at lr 1e-2 moves a parameter by about 1e-2
      // a step whatever its gradient, so gradients computed from quantized values may move the
      // parameters apart by about 2e-2, and the read adds half a scale.
      const float bound = 0.04f + absmax(full.forward[u]) / 127.0f;
      for (size_t e = 0; e < kSizes[u]; ++e) CHECK(std::fabs(a.forward[u][e] - full.forward[u][e]) <= bound);
    }
    // fp32 units gathered as int8 with an fp32 scale per 64 elements: about 1/4 of the bytes.
    CHECK(a.gathered_bytes * 10 < full.gathered_bytes * 3);
    CHECK(a.gathered_bytes * 5 > full.gathered_bytes);
  }
}

TEST_CASE("qwZ: a non-finite parameter stops every rank at the step's end, naming the rank and the unit") {
  std::vector<std::string> errors;
  run(2, {.bits = 8, .steps = 1, .nan = true}, &errors);
  REQUIRE(errors.size() == 2);
  for (const std::string& e : errors) {
    CHECK(e.find("quantized gathers (EngineOptions.quantized_weights): non-finite parameters this step") !=
          std::string::npos);
    CHECK(e.find("unit 1 (1 values)") != std::string::npos);
  }
  CHECK(errors[0] == errors[1]);
}

TEST_CASE("qwZ: refused below stage 3, at other widths and with an empty block, naming the option") {
  EngineOptions o;
  o.stage = 2;
  o.quantized_weights.bits = 8;
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("quantized_weights (qwZ) needs stage 3"), InvalidArgument);
  o.stage = 3;
  o.quantized_weights.bits = 6;
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("quantized_weights.bits must be 0 (off), 8 or 4, got 6"),
                       InvalidArgument);
  o.quantized_weights = {.bits = 8, .block = 0};
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("quantized_weights.block must be positive"), InvalidArgument);
}

TEST_CASE("qwZ: a quantization block never mixes two tensors, so a small tensor keeps its own scale") {
  // One unit: a LayerNorm-like gain near 1 (40 values), then weights near 0.01 (300 values). With
  // a block of 64 shared by both, the weights would be rounded in steps of 1/127.
  testing::run_thread_ranks(2, [](comm::Communicator& comm) {
    EngineOptions opt;
    opt.stage = 3;
    opt.optimizer.kind = optim::OptimizerKind::kSgd;
    opt.timeout = 30s;
    opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 64};
    opt.quantized_weights = {.bits = 8, .block = 64, .evaluation = true};  // the evaluation reads what a forward does
    Engine engine(comm, opt);
    std::vector<float> gain(40, 1.0f), w(300);
    for (size_t e = 0; e < w.size(); ++e) w[e] = 0.01f * std::sin(0.3f * static_cast<float>(e));
    const std::vector<float> w0 = w;  // stage 3 owns the values from finalize() on
    const int g = engine.add_param({.name = "ln.w", .shape = {40}, .dtype = DType::kFloat32, .data = {gain.data(), 40}, .unit = 0});
    const int m = engine.add_param({.name = "fc.w", .shape = {300}, .dtype = DType::kFloat32, .data = {w.data(), 300}, .unit = 0});
    engine.finalize();
    EvaluationScope eval = engine.evaluation();
    UnitScope s = engine.gather(0);
    const float* read = s.param_as<float>(m);
    const float bound = 0.01f / 127 / 2 * (1 + 1e-6f);
    for (size_t e = 0; e < w0.size(); ++e) CHECK(std::fabs(read[e] - w0[e]) <= bound);
    CHECK(s.param_as<float>(g)[0] == 1.0f);
  });
  // A layout block that the quantization block does not divide is refused, naming both.
  testing::run_thread_ranks(1, [](comm::Communicator& comm) {
    EngineOptions opt;
    opt.stage = 3;
    opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 16};
    opt.quantized_weights = {.bits = 8, .block = 64};
    Engine engine(comm, opt);
    std::vector<float> w(10);
    engine.add_param({.name = "w", .shape = {10}, .dtype = DType::kFloat32, .data = {w.data(), 10}, .unit = 0});
    CHECK_THROWS_WITH_AS(engine.finalize(), doctest::Contains("layout.block (16) must be a multiple of the quantized "
                                                              "collectives' blocks"),
                         InvalidArgument);
  });
}

TEST_CASE("qwZ: units of several tensors train bitwise alike with and without offload") {
  // Tensors of a unit start on quantization blocks: the padding between them must not change what
  // the host optimizer computes.
  auto train = [](bool offload) {
    std::vector<std::string> errors;
    auto out = testing::thread_rank_results<std::vector<float>>(
        2,
        [&](comm::Communicator& comm) {
          EngineOptions opt;
          opt.stage = 3;
          opt.optimizer.kind = optim::OptimizerKind::kAdamW;
          opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
          opt.deterministic = true;
          opt.max_grad_norm = 1.0f;
          opt.timeout = 30s;
          opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 64};
          opt.quantized_weights = {.bits = 8, .block = 64, .evaluation = true};
          opt.offload.optimizer = opt.offload.params = offload;
          Engine engine(comm, opt);
          const std::vector<size_t> sizes = {40, 300, 7, 1000, 3};
          std::vector<std::vector<float>> storage(sizes.size());
          std::vector<int> ids;
          for (size_t t = 0; t < sizes.size(); ++t) {
            storage[t].resize(sizes[t]);
            for (size_t e = 0; e < sizes[t]; ++e) storage[t][e] = (t % 2 == 0 ? 1.0f : 0.02f) * std::cos(0.7f * static_cast<float>(e + t));
            ids.push_back(engine.add_param({.name = "t" + std::to_string(t), .shape = {static_cast<int64_t>(sizes[t])},
                                            .dtype = DType::kFloat32, .data = {storage[t].data(), sizes[t]},
                                            .unit = static_cast<int>(t / 2)}));
          }
          engine.finalize();
          for (int step = 0; step < 4; ++step) {
            for (int u = 0; u < 3; ++u) UnitScope s = engine.gather(u);
            for (int u = 3; u-- > 0;) {
              UnitScope s = engine.gather_for_backward(u);
              for (size_t t = 0; t < sizes.size(); ++t) {
                if (static_cast<int>(t / 2) != u) continue;
                const float* p = s.param_as<float>(ids[t]);
                float* g = s.grad_as<float>(ids[t]);
                for (size_t e = 0; e < sizes[t]; ++e) g[e] += p[e] - 0.1f * std::sin(static_cast<float>(e + comm.rank() + step));
              }
            }
            engine.step();
          }
          std::vector<float> all;
          EvaluationScope eval = engine.evaluation();
          for (int u = 0; u < 3; ++u) {
            UnitScope s = engine.gather(u);
            for (size_t t = 0; t < sizes.size(); ++t) {
              if (static_cast<int>(t / 2) != u) continue;
              const float* p = s.param_as<float>(ids[t]);
              all.insert(all.end(), p, p + sizes[t]);
            }
          }
          return all;
        },
        errors);
    for (const std::string& e : errors) FAIL_CHECK(e);
    return out[0];
  };
  const std::vector<float> device = train(false), host = train(true);
  REQUIRE(device.size() == host.size());
  size_t differ = 0;
  for (size_t i = 0; i < device.size(); ++i) differ += device[i] != host[i] ? 1 : 0;
  CHECK(differ == 0);
}

TEST_CASE("qwZ: evaluations gather at full precision unless asked") {
  for (bool quantized_evaluation : {false, true}) {
    CAPTURE(quantized_evaluation);
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
      EngineOptions opt;
      opt.stage = 3;
      opt.timeout = 30s;
      opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 64};
      opt.quantized_weights = {.bits = 8, .block = 64, .evaluation = quantized_evaluation};
      Engine engine(comm, opt);
      std::vector<float> w(500);
      for (size_t e = 0; e < w.size(); ++e) w[e] = std::sin(0.37f * static_cast<float>(e));
      const std::vector<float> w0 = w;
      const int id = engine.add_param({.name = "w", .shape = {500}, .dtype = DType::kFloat32, .data = {w.data(), 500}, .unit = 0});
      engine.finalize();
      std::vector<float> training, evaluation;
      {
        UnitScope s = engine.gather(0);
        training.assign(s.param_as<float>(id), s.param_as<float>(id) + 500);
      }
      {
        EvaluationScope eval = engine.evaluation();
        UnitScope s = engine.gather(0);
        evaluation.assign(s.param_as<float>(id), s.param_as<float>(id) + 500);
      }
      CHECK(training != w0);  // the training forward reads quantized values
      CHECK(evaluation == (quantized_evaluation ? training : w0));
    });
  }
}

TEST_CASE("qwZ: bf16 units read within half a scale and bf16's rounding, every tensor and rank") {
  testing::run_thread_ranks(3, [](comm::Communicator& comm) {
    EngineOptions opt;
    opt.stage = 3;
    opt.timeout = 30s;
    opt.quantized_weights = {.bits = 8};  // blocks of 256, the default layout
    Engine engine(comm, opt);
    const std::vector<size_t> sizes = {64, 64, 12288, 192, 4096, 64, 16384, 256};  // a GPT block's shapes
    std::vector<std::vector<uint16_t>> bits(sizes.size());
    std::vector<std::vector<float>> values(sizes.size());
    std::vector<int> ids;
    for (size_t t = 0; t < sizes.size(); ++t) {
      values[t].resize(sizes[t]);
      for (size_t e = 0; e < sizes[t]; ++e) {
        values[t][e] = (t < 2 ? 1.0f : 0.02f) * std::sin(0.61f * static_cast<float>(e) + static_cast<float>(t));
      }
      bits[t].resize(sizes[t]);
      convert_fp32_to_bf16(values[t].data(), bits[t].data(), sizes[t]);
      convert_bf16_to_fp32(bits[t].data(), values[t].data(), sizes[t]);  // exactly what is registered
      ids.push_back(engine.add_param({.name = "t" + std::to_string(t), .shape = {static_cast<int64_t>(sizes[t])},
                                      .dtype = DType::kBFloat16, .data = {bits[t].data(), sizes[t]}, .unit = 0}));
    }
    engine.finalize();
    UnitScope s = engine.gather(0);
    for (size_t t = 0; t < sizes.size(); ++t) {
      CAPTURE(t);
      std::vector<float> read(sizes[t]);
      convert_bf16_to_fp32(static_cast<const uint16_t*>(s.param(ids[t])), read.data(), sizes[t]);
      float absmax = 0;
      for (float v : values[t]) absmax = std::max(absmax, std::fabs(v));
      size_t bad = 0;
      for (size_t e = 0; e < sizes[t]; ++e) {
        // Half a scale of the tensor's largest value (a block's is at most that), then bf16's rounding.
        const float bound = absmax / 127 / 2 + std::fabs(values[t][e]) / 256 + 1e-30f;
        bad += std::fabs(read[e] - values[t][e]) <= bound ? 0 : 1;
      }
      CHECK(bad == 0);
    }
  });
}

}  // namespace zero
