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
