#include "zero/memory_report.h"

#include <doctest/doctest.h>

#include <vector>

#include "memory/tracker.h"

namespace zero {

TEST_CASE("the ZeRO formulas for 16-bit parameters and Adam") {
  const uint64_t psi = 1000000;
  for (int n : {1, 2, 4, 8}) {
    MemoryFormulaInputs in{.stage = 0, .world_size = n, .numel = psi, .param_bytes = 2,
                           .grad_bytes = 2, .shard_grad_bytes = 2, .accumulator = false,
                           .state_bytes = 8};
    CHECK(predict_memory(in).total() == 16 * psi);
    in.stage = 1;
    CHECK(predict_memory(in).total() == 4 * psi + 12 * psi / n);
    in.stage = 2;
    CHECK(predict_memory(in).total() == 2 * psi + 14 * psi / n);
    CHECK(predict_memory(in).formula == "2Ψ + 2Ψ/N + 12Ψ/N");
  }
}

TEST_CASE("accumulators and fp32 gradient shards change the prediction") {
  const uint64_t psi = 1 << 20;
  MemoryFormulaInputs in{.stage = 1, .world_size = 4, .numel = psi, .param_bytes = 2,
                         .grad_bytes = 2, .shard_grad_bytes = 4, .accumulator = true,
                         .state_bytes = 8};
  CHECK(predict_memory(in).grads == 2 * psi + psi);
  in.stage = 2;
  CHECK(predict_memory(in).grads == psi);
  in.stage = 0;
  CHECK(predict_memory(in).grads == 6 * psi);
}

TEST_CASE("offload moves master and state (and at stage 3 the parameter shard) to the host tier") {
  const uint64_t psi = 1000000;
  for (int n : {1, 2, 4}) {
    MemoryFormulaInputs in{.stage = 1, .world_size = n, .numel = psi, .param_bytes = 2, .grad_bytes = 2,
                           .shard_grad_bytes = 2, .accumulator = false, .state_bytes = 8, .offload_optimizer = true};
    CHECK(predict_memory(in).total() == 4 * psi);
    CHECK(predict_memory(in).offload_total() == 12 * psi / n);
    in.stage = 2;
    CHECK(predict_memory(in).total() == 2 * psi + 2 * psi / n);
    CHECK(predict_memory(in).formula == "2Ψ + 2Ψ/N; host 12Ψ/N");
    in.stage = 3;
    CHECK(predict_memory(in).total() == 4 * psi / n);
    in.offload_params = true;
    CHECK(predict_memory(in).total() == 2 * psi / n);
    CHECK(predict_memory(in).offload_total() == 14 * psi / n);
    CHECK(predict_memory(in).formula == "2Ψ/N; host 2Ψ/N + 12Ψ/N");
    in.stage = 0;
    in.offload_params = false;
    CHECK(predict_memory(in).offload_total() == 12 * psi);
  }
}

TEST_CASE("the host tier is compared on its own") {
  MemoryReport r;
  r.rows.push_back({"grads", 50, 60, 40, true});
  r.rows.push_back({"offload master", 400, 400, 400, true, true});
  r.rows.push_back({"offload staging", 30, 30, 0, false, true});
  CHECK(r.offloaded());
  CHECK(r.formula_current() == 50);
  CHECK(r.host_current() == 400);
  CHECK(r.host_ratio() == doctest::Approx(1.0));
  CHECK(r.table().find("host formula") != std::string::npos);
}

TEST_CASE("report table and ratio") {
  MemoryReport r;
  r.rows.push_back({"params (user)", 100, 100, 100, true});
  r.rows.push_back({"grads", 50, 60, 40, true});
  r.rows.push_back({"comm_buffer", 1000, 1000, 0, false});
  CHECK(r.formula_current() == 150);
  CHECK(r.formula_predicted() == 140);
  CHECK(r.ratio() == doctest::Approx(150.0 / 140.0));
  CHECK(r.table().find("comm_buffer") != std::string::npos);
}

TEST_CASE("every row the builder makes is in one column, and the columns add their rows' peaks") {
  // Stage 3 with both offloads and hpZ's parts: every row the builder can make.
  memory::MemoryTracker device, host;
  const memory::Location here{memory::DeviceKind::kHost, 0};
  using memory::Category;
  const std::vector<std::pair<Category, size_t>> device_bytes = {
      {Category::kParams, 100}, {Category::kGrads, 20},        {Category::kMasterParams, 3},
      {Category::kOptimizerState, 4000}, {Category::kCommBuffer, 500}, {Category::kGatherWindow, 60},
      {Category::kSecondaryShard, 7}};
  for (const auto& [c, b] : device_bytes) device.on_alloc(c, here, b);
  for (const auto& [c, b] : std::vector<std::pair<Category, size_t>>{
           {Category::kParams, 1}, {Category::kMasterParams, 10}, {Category::kOptimizerState, 1000},
           {Category::kOffloadHost, 90000}}) {
    host.on_alloc(c, here, b);
  }
  std::vector<float> w(8);
  ParamRegistry registry;
  registry.add({.name = "w", .shape = {8}, .dtype = DType::kFloat32, .data = {w.data(), w.size()}});
  EngineMemory em{.tracker = &device, .offload_tracker = &host, .registry = &registry};
  em.formula = {.stage = 3, .world_size = 2, .offload_optimizer = true, .offload_params = true, .secondary_shard = 7};
  const MemoryReport r = build_memory_report(em);
  for (const MemoryReport::Row& row : r.rows) {
    CAPTURE(row.category);
    CHECK(row.column != MemoryColumn::kNone);
    CHECK((row.column == MemoryColumn::kHost) == row.host_tier);
  }
  const std::vector<uint64_t> c = r.column_peaks();
  REQUIRE(c.size() == static_cast<size_t>(kNumMemoryColumns));
  auto at = [&](MemoryColumn column) { return c[static_cast<size_t>(column)]; };
  CHECK(at(MemoryColumn::kParams) == 100);
  CHECK(at(MemoryColumn::kGrads) == 20);
  CHECK(at(MemoryColumn::kMaster) == 3);
  CHECK(at(MemoryColumn::kOptimizer) == 4000);
  CHECK(at(MemoryColumn::kBuffers) == 500);
  CHECK(at(MemoryColumn::kWindow) == 67);  // the gather window and the node parts beside it
  CHECK(at(MemoryColumn::kHost) == 91011);
  CHECK(std::string(memory_column_name(MemoryColumn::kWindow)) == "window");
}

}  // namespace zero
