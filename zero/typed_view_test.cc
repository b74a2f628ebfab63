// Typed views: a view whose element type does not match the registered dtype is refused, naming the
// parameter, at the registry and through every accessor of the engine and its scopes, at stage 2
// (the user's storage) and stage 3 (the gathered copy); matching views span the whole parameter.
#include "zero/typed_view.h"

#include <doctest/doctest.h>

#include <vector>

#include "base/error.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero {

TEST_CASE("a view's type must match the registered dtype") {
  std::vector<float> a(6);
  std::vector<uint16_t> b(4), c(5);
  ParamRegistry reg;
  reg.add({.name = "a", .shape = {2, 3}, .dtype = DType::kFloat32, .data = {a.data(), 6}});
  reg.add({.name = "b", .shape = {4}, .dtype = DType::kBFloat16, .data = {b.data(), 4}});
  reg.add({.name = "c", .shape = {5}, .dtype = DType::kFloat16, .data = {c.data(), 5}});
  CHECK(checked_view_numel(reg, 0, view_type<float>()) == 6);
  CHECK(checked_view_numel(reg, 0, view_type<const float>()) == 6);
  CHECK(checked_view_numel(reg, 1, view_type<BFloat16>()) == 4);
  CHECK(checked_view_numel(reg, 1, view_type<uint16_t>()) == 4);
  CHECK(checked_view_numel(reg, 2, view_type<Half>()) == 5);
  CHECK(checked_view_numel(reg, 2, view_type<uint16_t>()) == 5);
  CHECK_THROWS_WITH_AS(checked_view_numel(reg, 1, view_type<float>()),
                       "parameter 'b' (id 1) is bf16: it cannot be viewed as float (use BFloat16 or uint16_t)",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(checked_view_numel(reg, 2, view_type<BFloat16>()),
                       "parameter 'c' (id 2) is fp16: it cannot be viewed as BFloat16 (use Half or uint16_t)",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(checked_view_numel(reg, 0, view_type<uint16_t>()),
                       "parameter 'a' (id 0) is fp32: it cannot be viewed as uint16_t (use float)", InvalidArgument);
  CHECK_THROWS_AS(checked_view_numel(reg, 3, view_type<float>()), InvalidArgument);  // no such id
}

TEST_CASE("the engine's and the scopes' typed accessors check the view") {
  for (int stage : {2, 3}) {
    CAPTURE(stage);
    testing::run_thread_ranks(1, [&](comm::Communicator& comm) {
      EngineOptions o;
      o.stage = stage;
      o.layout = {.alignment = 4, .bucket_numel = 256, .block = 16};
      Engine engine(comm, o);
      std::vector<uint16_t> w(8, 0x3f80);  // bf16 1.0
      const int id = engine.add_param({.name = "w", .shape = {8}, .dtype = DType::kBFloat16, .data = {w.data(), 8}});
      engine.finalize();
      {
        auto s = engine.gather(0);
        CHECK(s.param_span<BFloat16>(id).size() == 8);
        CHECK(s.param_span<uint16_t>(id)[7] == 0x3f80);
        CHECK_THROWS_WITH_AS(s.param_as<float>(id), doctest::Contains("parameter 'w' (id 0) is bf16"),
                             InvalidArgument);
      }
      {
        auto s = engine.gather_for_backward(0);
        CHECK(s.grad_span<uint16_t>(id).size() == 8);
        CHECK(engine.grad_span<BFloat16>(id).size() == 8);
        CHECK_THROWS_WITH_AS(s.grad_as<float>(id), doctest::Contains("cannot be viewed as float"), InvalidArgument);
        CHECK_THROWS_WITH_AS(engine.grad_as<Half>(id), doctest::Contains("cannot be viewed as Half"), InvalidArgument);
      }
      engine.step();
    });
  }
}

}  // namespace zero
