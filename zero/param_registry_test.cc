// ParamRegistry: units and their parameters in registration order; every local problem with a
// registration remembered (the first one) without shifting the ids of later parameters, and raised
// on every rank by verify_across_ranks; registrations that differ across ranks named by parameter
// and rank.
#include "zero/param_registry.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "testing/thread_ranks.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

// A fp32 parameter of `numel` elements over `storage` (resized to fit).
ParamSpec spec(const std::string& name, std::vector<float>& storage, int64_t numel, int unit = 0) {
  storage.resize(static_cast<size_t>(numel));
  return {.name = name,
          .shape = {numel},
          .dtype = DType::kFloat32,
          .data = {storage.data(), storage.size()},
          .unit = unit};
}

// What verify_across_ranks threw on this rank ("" and a failed check when it threw nothing).
std::string verify_error(const ParamRegistry& reg, comm::Communicator& comm) {
  try {
    reg.verify_across_ranks(comm, 10s);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  FAIL_CHECK("no error on rank " << comm.rank());
  return {};
}

}  // namespace

TEST_CASE("units in order of first registration, each with its parameters in registration order") {
  std::vector<float> a, b, c, d, e;
  ParamRegistry reg;
  CHECK(reg.add(spec("a", a, 4, 2)) == 0);
  CHECK(reg.add(spec("b", b, 8, 0)) == 1);
  CHECK(reg.add(spec("c", c, 2, 2)) == 2);
  ParamSpec frozen = spec("d", d, 3, 1);
  frozen.requires_grad = false;
  CHECK(reg.add(frozen) == 3);
  CHECK(reg.add(spec("e", e, 5, 0)) == 4);
  CHECK(reg.local_error().empty());
  CHECK(reg.units() == std::vector<int>{2, 0, 1});
  CHECK(reg.params_of_unit(2) == std::vector<int>{0, 2});
  CHECK(reg.params_of_unit(0) == std::vector<int>{1, 4});
  CHECK(reg.params_of_unit(1) == std::vector<int>{3});
  CHECK(reg.params_of_unit(7).empty());
  CHECK(reg.trainable() == std::vector<int>{0, 1, 2, 4});
  CHECK(reg.numel(1) == 8);
  CHECK(reg.find("c") == 2);
  CHECK_FALSE(reg.find("z").has_value());
  CHECK(reg.param(4).name == "e");
  CHECK_THROWS_WITH_AS(reg.param(5), doctest::Contains("parameter id 5 is not registered (5 parameters)"),
                       InvalidArgument);
  CHECK(reg.signature_lines()[3] == "'d' shape [3] fp32 frozen group 0 unit 1");
}

TEST_CASE("a bad registration is remembered, naming the parameter and what is wrong, and ids stay aligned") {
  std::vector<float> x(6), g(5);
  struct Case {
    const char* what;
    ParamSpec spec;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"empty name", {.name = "", .shape = {6}, .data = {x.data(), 6}}, "parameter #1 has an empty name"},
      {"newline in the name", {.name = "w\n", .shape = {6}, .data = {x.data(), 6}}, "holds a tab or a newline"},
      {"registered twice", {.name = "first", .shape = {6}, .data = {x.data(), 6}},
       "parameter 'first' is registered twice"},
      {"integer dtype", {.name = "w", .shape = {6}, .dtype = DType::kInt64, .data = {x.data(), 6}},
       "parameter 'w': dtype int64 is not fp32, fp16 or bf16"},
      {"zero dimension", {.name = "w", .shape = {2, 0}, .data = {x.data(), 6}},
       "parameter 'w': shape [2, 0] has a non-positive dimension"},
      {"overflowing shape", {.name = "w", .shape = {1ll << 40, 1ll << 40}, .data = {x.data(), 6}},
       "overflows the element count"},
      {"null data", {.name = "w", .shape = {6}, .data = {nullptr, 6}}, "parameter 'w': data pointer is null"},
      {"data too short", {.name = "w", .shape = {2, 3}, .data = {x.data(), 5}},
       "parameter 'w': data holds 5 elements but shape [2, 3] needs 6"},
      {"gradient too short", {.name = "w", .shape = {6}, .data = {x.data(), 6}, .grad = {g.data(), 5}},
       "parameter 'w': gradient pointer holds 5 elements but shape [6] needs 6"},
      {"negative group", {.name = "w", .shape = {6}, .data = {x.data(), 6}, .group = -1}, "group -1 < 0"},
      {"negative unit", {.name = "w", .shape = {6}, .data = {x.data(), 6}, .unit = -2}, "unit -2 < 0"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    std::vector<float> first, last;
    ParamRegistry reg;
    reg.add(spec("first", first, 4));
    CHECK(reg.add(c.spec) == 1);
    CHECK(reg.add(spec("last", last, 4)) == 2);  // later ids are not shifted
    CHECK_MESSAGE(reg.local_error().find(c.error) != std::string::npos, reg.local_error());
    // Only the first problem is kept.
    reg.note_error("a later problem");
    CHECK(reg.local_error().find("a later problem") == std::string::npos);
  }
}

TEST_CASE("verify_across_ranks: agreement passes; a difference or one rank's local error fails every rank") {
  auto registration = [](ParamRegistry& reg, std::vector<std::vector<float>>& storage, int rank, const char* how) {
    storage.resize(3);
    reg.add(spec("embed", storage[0], 16));
    // "shape": rank 1 registers a different shape; "bad": rank 1's registration has a local error.
    const int64_t n = (std::string(how) == "shape" && rank == 1) ? 12 : 8;
    reg.add(spec("block.w", storage[1], n, 1));
    if (std::string(how) == "bad" && rank == 1) {
      reg.add({.name = "head", .shape = {4}, .data = {nullptr, 4}});
    } else {
      reg.add(spec("head", storage[2], 4, 2));
    }
  };
  SUBCASE("the same registration") {
    testing::run_thread_ranks(3, [&](comm::Communicator& comm) {
      ParamRegistry reg;
      std::vector<std::vector<float>> storage;
      registration(reg, storage, comm.rank(), "same");
      CHECK_NOTHROW(reg.verify_across_ranks(comm, 10s));
    });
  }
  SUBCASE("a shape that differs on rank 1") {
    testing::run_thread_ranks(3, [&](comm::Communicator& comm) {
      ParamRegistry reg;
      std::vector<std::vector<float>> storage;
      registration(reg, storage, comm.rank(), "shape");
      const std::string what = verify_error(reg, comm);
      CHECK_MESSAGE(what.find("ranks differing from rank 0: 1)") != std::string::npos, what);
      CHECK_MESSAGE(what.find("parameter #1") != std::string::npos, what);
      CHECK_MESSAGE(what.find("[12]") != std::string::npos, what);
    });
  }
  SUBCASE("a local error on rank 1 only") {
    testing::run_thread_ranks(3, [&](comm::Communicator& comm) {
      ParamRegistry reg;
      std::vector<std::vector<float>> storage;
      registration(reg, storage, comm.rank(), "bad");
      const std::string what = verify_error(reg, comm);
      CHECK_MESSAGE(what.find("rank 1: parameter 'head': data pointer is null") != std::string::npos, what);
    });
  }
}

}  // namespace zero
