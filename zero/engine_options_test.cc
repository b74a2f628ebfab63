#include "zero/engine_options.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "base/error.h"

namespace zero {
namespace {

bool has_field(const EngineOptions& o, const std::string& field, const std::string& value) {
  const auto f = fingerprint(o);
  return std::find(f.begin(), f.end(), std::make_pair(field, value)) != f.end();
}

}  // namespace

TEST_CASE("the defaults are valid") { CHECK_NOTHROW(validate(EngineOptions{})); }

TEST_CASE("bad values name the field") {
  auto error_of = [](const std::function<void(EngineOptions&)>& edit) {
    EngineOptions o;
    edit(o);
    try {
      validate(o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error_of([](EngineOptions& o) { o.stage = 4; }).find("EngineOptions.stage") != std::string::npos);
  CHECK(error_of([](EngineOptions& o) { o.max_grad_norm = -1.0f; }).find("EngineOptions.max_grad_norm") !=
        std::string::npos);
  CHECK(error_of([](EngineOptions& o) { o.micro_batches = 0; }).find("EngineOptions.micro_batches") != std::string::npos);
}

TEST_CASE("ZeRO++'s options: widths, blocks, node size and stage are refused by field") {
  EngineOptions o;
  o.stage = 3;
  auto refused = [&](const std::function<void(EngineOptions&)>& edit, const char* what) {
    EngineOptions bad = o;
    edit(bad);
    CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains(what), InvalidArgument);
  };
  refused([](EngineOptions& e) { e.quantized_weights.bits = 2; },
          "EngineOptions.quantized_weights.bits must be 0 (off), 8 or 4, got 2");
  refused([](EngineOptions& e) { e.quantized_weights = {.bits = 8, .block = 0}; },
          "EngineOptions.quantized_weights.block must be positive");
  refused([](EngineOptions& e) { e.quantized_gradients.bits = 16; },
          "EngineOptions.quantized_gradients.bits must be 0 (off), 8 or 4, got 16");
  refused([](EngineOptions& e) { e.quantized_gradients = {.bits = 4, .block = 0}; },
          "EngineOptions.quantized_gradients.block must be positive");
  refused([](EngineOptions& e) { e.node_size = -1; }, "EngineOptions.node_size must be >= 0, got -1");
  refused([](EngineOptions& e) { e.replica_check_every = -2; },
          "EngineOptions.replica_check_every must be >= 0 (0: never), got -2");
  refused([](EngineOptions& e) { e.stage = 2, e.secondary_shard = true; },
          "EngineOptions.secondary_shard (hpZ) needs stage 3 (got stage 2)");
  refused([](EngineOptions& e) { e.stage = 1, e.quantized_gradients.bits = 8; },
          "EngineOptions.quantized_gradients (qgZ) needs stage 3 (got stage 1)");
  // A zero block is harmless while its quantizer is off.
  EngineOptions off = o;
  off.quantized_weights.block = 0;
  off.quantized_gradients.block = 0;
  CHECK_NOTHROW(validate(off));
  o.quantized_weights.bits = 8;
  o.quantized_gradients.bits = 4;
  o.secondary_shard = true;
  o.node_size = 2;
  CHECK_NOTHROW(validate(o));
}

TEST_CASE("parameter offload needs stage 3 and the optimizer offloaded") {
  EngineOptions o;
  o.stage = 3;
  o.offload.optimizer = true;
  o.offload.params = true;
  CHECK_NOTHROW(validate(o));
  o.stage = 2;
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("EngineOptions.offload.params needs stage 3 (got stage 2)"),
                       InvalidArgument);
  o.stage = 3;
  o.offload.optimizer = false;
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("and offload.optimizer (got false)"), InvalidArgument);
  // The optimizer alone may be offloaded at any stage.
  o.offload.optimizer = true;
  o.offload.params = false;
  for (int stage : {0, 1, 2, 3}) {
    o.stage = stage;
    CHECK_NOTHROW(validate(o));
  }
}

TEST_CASE("ranks must agree on what is offloaded, not on how it is staged") {
  EngineOptions o;
  o.offload.optimizer = true;
  CHECK(has_field(o, "EngineOptions.offload.optimizer", "true"));
  CHECK(has_field(o, "EngineOptions.offload.params", "false"));
  const auto pinned = fingerprint(o);
  o.offload.pinned_staging = false;
  CHECK(fingerprint(o) == pinned);
}

}  // namespace zero
