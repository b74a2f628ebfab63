// The stage policy's table: which layout, ownership, gatherer, writeback and memory formula each
// stage gets, where offload puts the optimizer and the parameter shard, and what it refuses. The
// expected figures are worked out by hand from the table in stage_policy.h and the ZeRO paper's
// formulas, not by calling the formula again.
#include "zero/stage_policy.h"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "memory/device.h"
#include "testing/thread_ranks.h"

namespace zero {
namespace {

// Two units: a 1000-element weight (unit 0) and a 10-element bias (unit 1), bf16, Ψ = 1010.
struct Model {
  std::vector<uint16_t> w = std::vector<uint16_t>(1000), b = std::vector<uint16_t>(10);
  ParamRegistry reg;
  Model() {
    for (size_t i = 0; i < w.size(); ++i) w[i] = fp32_to_bf16_bits(0.001f * static_cast<float>(i));
    for (size_t i = 0; i < b.size(); ++i) b[i] = fp32_to_bf16_bits(-0.5f * static_cast<float>(i));
    reg.add({.name = "w", .shape = {1000}, .dtype = DType::kBFloat16, .data = {w.data(), w.size()}, .unit = 0});
    reg.add({.name = "b", .shape = {10}, .dtype = DType::kBFloat16, .data = {b.data(), b.size()}, .unit = 1});
  }
};

EngineOptions options_for(int stage) {
  EngineOptions o;
  o.stage = stage;
  o.grad_accum_dtype = DType::kBFloat16;
  o.layout = {.alignment = 4, .bucket_numel = 256, .block = 16};
  return o;
}

// The ZeRO formula at Ψ = 1010, N = 2, bf16 parameters and gradients (2 bytes), Adam's two fp32
// states (k = 8), a bf16 stage 2/3 accumulator, one micro-step.
struct Expected {
  uint64_t params, grads, master, state;
  const char* formula;
};
constexpr Expected kExpected[4] = {
    {2020, 2020, 4040, 8080, "2Ψ + 2Ψ + 12Ψ"},         // stage 0: everything replicated
    {2020, 2020, 2020, 4040, "2Ψ + 2Ψ + 12Ψ/N"},       // stage 1: master and state sharded
    {2020, 1010, 2020, 4040, "2Ψ + 2Ψ/N + 12Ψ/N"},     // stage 2: gradients too
    {1010, 1010, 2020, 4040, "2Ψ/N + 2Ψ/N + 12Ψ/N"},   // stage 3: parameters too
};

TEST_CASE("each stage wires its layout, ownership, gatherer, writeback and memory formula") {
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    for (int stage : {0, 1, 2, 3}) {
      CAPTURE(stage);
      memory::MemoryTracker tracker;
      auto device = memory::make_host_device(tracker);
      Model m;
      const std::vector<uint16_t> w_before = m.w;
      EngineOptions o = options_for(stage);
      const std::optional<ModelDtypes> dtypes = check_registration(o, m.reg);
      REQUIRE(dtypes);
      REQUIRE(dtypes->storage == DType::kBFloat16);
      REQUIRE(dtypes->compute(m.reg.param(0)) == DType::kBFloat16);
      EngineParts parts = wire_stage({&o, micro_batching(o, false), &m.reg, {0, 1}, *dtypes, &comm, nullptr, device.get()});

      CHECK(parts.ownership->is_replicated() == (stage == 0));
      CHECK(parts.offload_tracker == nullptr);
      // Stage 3 lays out one bucket per unit (what the gatherer fetches and the reducer reduces as one);
      // below it the 1000-element weight spans several 256-element buckets.
      const auto& buckets = parts.layout->buckets();
      if (stage == 3) {
        REQUIRE(buckets.size() == 2);
        CHECK(parts.layout->bucket_of(0) == 0);
        CHECK(parts.layout->bucket_of(999) == 0);
        CHECK(parts.layout->bucket_of(parts.layout->tensors()[1].offset) == 1);
      } else {
        CHECK(buckets.size() > 2);
      }
      CHECK((parts.gatherer != nullptr) == (stage == 3));

      // Stage 3 holds the parameters in its shard (tracked) and poisons the registered storage, so a
      // stale read shows as NaN; below it the user's storage keeps its values and nothing of it is
      // tracked.
      const uint64_t param_bytes = tracker.usage(memory::Category::kParams).current;
      if (stage == 3) {
        CHECK(param_bytes == 2 * parts.ownership->numel());
        size_t nan = 0;
        for (uint16_t v : m.w) nan += std::isnan(bf16_bits_to_fp32(v));
        CHECK(nan == m.w.size());
      } else {
        CHECK(param_bytes == 0);
        CHECK(m.w == w_before);
      }
      // Master and state on the device, over the rank's share of the (padded) layout.
      const uint64_t owned = parts.ownership->numel();
      CHECK(owned == (stage == 0 ? parts.layout->padded_numel() : parts.layout->shard_numel()));
      CHECK(tracker.usage(memory::Category::kMasterParams).current == 4 * owned);
      CHECK(tracker.usage(memory::Category::kOptimizerState).current == 8 * owned);

      const MemoryFormulaInputs& f = parts.formula;
      CHECK(f.stage == stage);
      CHECK(f.world_size == 2);
      CHECK(f.param_bytes == 2);
      CHECK(f.grad_bytes == 2);
      CHECK(f.shard_grad_bytes == (stage >= 2 ? 2u : 4u));
      CHECK_FALSE(f.accumulator);
      CHECK(f.state_bytes == 8u);
      CHECK_FALSE(f.offload_optimizer);
      CHECK_FALSE(f.offload_params);
      MemoryFormulaInputs in = f;
      in.numel = 1010;
      const MemoryPrediction p = predict_memory(in);
      const Expected& e = kExpected[stage];
      CHECK(p.params == e.params);
      CHECK(p.grads == e.grads);
      CHECK(p.master == e.master);
      CHECK(p.optimizer_state == e.state);
      CHECK(p.formula == e.formula);
    }
  });
}

TEST_CASE("accumulation below stage 2 keeps an fp32 accumulator in the formula") {
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    for (int stage : {0, 1}) {
      CAPTURE(stage);
      memory::MemoryTracker tracker;
      auto device = memory::make_host_device(tracker);
      Model m;
      EngineOptions o = options_for(stage);
      o.micro_batches = 4;
      o.micro_batch_reduce = MicroBatchReduce::kEach;
      const std::optional<ModelDtypes> dtypes = check_registration(o, m.reg);
      EngineParts parts = wire_stage({&o, micro_batching(o, false), &m.reg, {0, 1}, *dtypes, &comm, nullptr, device.get()});
      CHECK(parts.formula.accumulator);
      MemoryFormulaInputs in = parts.formula;
      in.numel = 1010;
      // 2Ψ of gradients plus 4Ψ (stage 0) or 4Ψ/N (stage 1) of fp32 accumulator.
      CHECK(predict_memory(in).grads == (stage == 0 ? 2020u + 4040u : 2020u + 2020u));
    }
  });
}

TEST_CASE("offload puts master and state in the host tier, and at stage 3 the parameter shard too") {
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    for (const bool params : {false, true}) {
      CAPTURE(params);
      memory::MemoryTracker tracker;
      auto device = memory::make_host_device(tracker);
      Model m;
      EngineOptions o = options_for(params ? 3 : 2);
      o.offload.optimizer = true;
      o.offload.params = params;
      const std::optional<ModelDtypes> dtypes = check_registration(o, m.reg);
      EngineParts parts = wire_stage({&o, micro_batching(o, false), &m.reg, {0, 1}, *dtypes, &comm, nullptr, device.get()});
      REQUIRE(parts.offload_tracker != nullptr);
      const memory::MemoryTracker& host = *parts.offload_tracker;
      const uint64_t owned = parts.ownership->numel();
      CHECK(tracker.usage(memory::Category::kMasterParams).current == 0);
      CHECK(tracker.usage(memory::Category::kOptimizerState).current == 0);
      CHECK(host.usage(memory::Category::kMasterParams).current == 4 * owned);
      CHECK(host.usage(memory::Category::kOptimizerState).current == 8 * owned);
      CHECK(tracker.usage(memory::Category::kParams).current == 0);
      CHECK(host.usage(memory::Category::kParams).current == (params ? 2 * owned : 0));
      CHECK(parts.formula.offload_optimizer);
      CHECK(parts.formula.offload_params == params);
      MemoryFormulaInputs in = parts.formula;
      in.numel = 1010;
      const MemoryPrediction p = predict_memory(in);
      CHECK(p.master == 0);
      CHECK(p.optimizer_state == 0);
      CHECK(p.offload_master == 2020);
      CHECK(p.offload_state == 4040);
      CHECK(p.params == (params ? 0u : 2020u));
      CHECK(p.offload_params == (params ? 1010u : 0u));
    }
  });
}

TEST_CASE("hybrid sharding needs a sharded stage") {
  EngineOptions o;
  o.stage = 0;
  CHECK_THROWS_WITH_AS(check_topology(o, true), doctest::Contains("needs a sharded stage"), InvalidArgument);
  for (int stage : {1, 2, 3}) {
    o.stage = stage;
    CHECK_NOTHROW(check_topology(o, true));
  }
  CHECK_NOTHROW(check_topology(EngineOptions{}, false));
}

TEST_CASE("registration problems only the options reveal are recorded for the cross-rank report") {
  std::vector<float> a(4);
  std::vector<uint16_t> b(4);
  ParamRegistry reg;
  reg.add({.name = "a", .shape = {4}, .dtype = DType::kFloat32, .data = {a.data(), 4}, .group = 3});
  reg.add({.name = "b", .shape = {4}, .dtype = DType::kBFloat16, .data = {b.data(), 4}});
  check_registration(EngineOptions{}, reg);
  CHECK(reg.local_error().find("parameter 'a': group 3 but the optimizer has 1 group(s)") != std::string::npos);
}

TEST_CASE("param_dtype narrows fp32 parameters only, and leaves gradients to the engine") {
  std::vector<float> a(4), ga(4);
  std::vector<uint16_t> b(4);
  EngineOptions o;
  o.stage = 3;
  o.param_dtype = DType::kBFloat16;
  const ParamSpec fp32{.name = "a", .shape = {4}, .dtype = DType::kFloat32, .data = {a.data(), 4}};
  // The error check_registration records for one parameter under `options` ("" for none).
  auto error_for = [](const ParamSpec& spec, const EngineOptions& options) {
    ParamRegistry reg;
    reg.add(spec);
    check_registration(options, reg);
    return reg.local_error();
  };
  {
    ParamRegistry reg;
    reg.add(fp32);
    const std::optional<ModelDtypes> dtypes = check_registration(o, reg);
    REQUIRE(dtypes);
    CHECK(dtypes->storage == DType::kFloat32);
    CHECK(dtypes->compute(fp32) == DType::kBFloat16);
    CHECK(reg.local_error().empty());
  }
  EngineOptions wider = o;
  wider.param_dtype = DType::kFloat32;
  CHECK(error_for({.name = "b", .shape = {4}, .dtype = DType::kBFloat16, .data = {b.data(), 4}}, wider)
            .find("EngineOptions.param_dtype fp32 with parameter 'b' in bf16: param_dtype must be the registered "
                  "dtype, or fp16 or bf16 with fp32 parameters") != std::string::npos);
  ParamSpec own_grad = fp32;
  own_grad.grad = {ga.data(), 4};
  CHECK(error_for(own_grad, o).find("parameter 'a' brings its own gradient storage (ParamSpec.grad) in fp32") !=
        std::string::npos);
  EngineOptions fp16_reduce = o;
  fp16_reduce.reduce_dtype = DType::kFloat16;
  CHECK(error_for(fp32, fp16_reduce)
            .find("EngineOptions.reduce_dtype fp16 must be fp32 or the dtype gradients are written in (bf16)") !=
        std::string::npos);
}

}  // namespace
}  // namespace zero
