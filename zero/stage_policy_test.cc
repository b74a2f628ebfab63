// The stage policy's table: which ownership, gradient buffers, writeback and memory formula each stage
// gets, and what it refuses.
#include "zero/stage_policy.h"

#include <doctest/doctest.h>

#include <vector>

#include "base/error.h"
#include "memory/device.h"
#include "testing/thread_ranks.h"

namespace zero {

TEST_CASE("each stage wires its ownership and memory formula") {
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    memory::MemoryTracker tracker;
    auto device = memory::make_host_device(tracker);
    std::vector<uint16_t> w(1000), b(10);
    ParamRegistry reg;
    reg.add({.name = "w", .shape = {1000}, .dtype = DType::kBFloat16, .data = {w.data(), w.size()}});
    reg.add({.name = "b", .shape = {10}, .dtype = DType::kBFloat16, .data = {b.data(), b.size()}});
    for (int stage : {0, 1, 2}) {
      CAPTURE(stage);
      EngineOptions o;
      o.stage = stage;
      o.grad_accum_dtype = DType::kBFloat16;
      o.layout = {.alignment = 4, .bucket_numel = 256, .block = 16};
      const std::optional<DType> dtype = check_registration(o, reg);
      REQUIRE(dtype == DType::kBFloat16);
      EngineParts parts = wire_stage({&o, &reg, {0, 1}, *dtype, &comm, nullptr, device.get()});
      CHECK(parts.ownership->is_replicated() == (stage == 0));
      CHECK(parts.formula.stage == stage);
      CHECK(parts.formula.shard_grad_bytes == (stage == 2 ? 2u : 4u));
      CHECK(parts.formula.state_bytes == 8u);
      CHECK(predict_memory({.stage = stage, .world_size = 2, .numel = 1010, .param_bytes = 2, .grad_bytes = 2,
                            .shard_grad_bytes = parts.formula.shard_grad_bytes, .state_bytes = 8})
                .total() == predict_memory([&] {
                  MemoryFormulaInputs in = parts.formula;
                  in.numel = 1010;
                  return in;
                }())
                                .total());
    }
  });
}

TEST_CASE("hybrid sharding needs a sharded stage") {
  EngineOptions o;
  o.stage = 0;
  CHECK_THROWS_WITH_AS(check_topology(o, true), doctest::Contains("needs a sharded stage"), InvalidArgument);
  o.stage = 1;
  CHECK_NOTHROW(check_topology(o, true));
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

}  // namespace zero
