#include "zero/engine_options.h"

#include <doctest/doctest.h>

#include <algorithm>

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
  EngineOptions o;
  o.stage = 4;
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("EngineOptions.stage"), InvalidArgument);
  o = {};
  o.max_grad_norm = -1.0f;
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("EngineOptions.max_grad_norm"), InvalidArgument);
  o = {};
  o.gradient_accumulation_steps = 0;
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("EngineOptions.gradient_accumulation_steps"), InvalidArgument);
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
  for (int stage : {0, 1, 2, 3}) {
    EngineOptions a;
    a.stage = stage;
    a.offload.optimizer = true;
    CHECK_NOTHROW(validate(a));
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
