// LR schedules: warm-up, cosine and linear decay, clamping, validation.
#include "optim/lr_schedule.h"

#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "base/error.h"

namespace zero::optim {
namespace {

TEST_CASE("constant, with and without warm-up") {
  CHECK(lr_at({.kind = "constant", .base_lr = 0.1f}, 0) == 0.1f);
  CHECK(lr_at({.kind = "constant", .base_lr = 0.1f}, 123456) == 0.1f);
  const LrScheduleOptions w{.kind = "constant", .base_lr = 0.1f, .warmup_steps = 4};
  CHECK(lr_at(w, 0) == doctest::Approx(0.025));
  CHECK(lr_at(w, 1) == doctest::Approx(0.05));
  CHECK(lr_at(w, 3) == 0.1f);
  CHECK(lr_at(w, 4) == 0.1f);
}

TEST_CASE("warmup_cosine") {
  const LrScheduleOptions o{.kind = "warmup_cosine", .base_lr = 1.0f, .warmup_steps = 10,
                            .total_steps = 110, .min_lr = 0.1f};
  CHECK(lr_at(o, 0) == doctest::Approx(0.1));
  CHECK(lr_at(o, 9) == 1.0f);
  CHECK(lr_at(o, 10) == 1.0f);
  CHECK(lr_at(o, 60) == doctest::Approx(0.55));  // halfway: (1 + cos(pi/2)) / 2
  CHECK(lr_at(o, 35) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25))));
  CHECK(lr_at(o, 110) == doctest::Approx(0.1));
  CHECK(lr_at(o, 1000000) == doctest::Approx(0.1));
  // Monotone after warm-up.
  for (int64_t s = 10; s < 120; ++s) CHECK(lr_at(o, s + 1) <= lr_at(o, s));
}

TEST_CASE("warmup_linear") {
  const LrScheduleOptions o{.kind = "warmup_linear", .base_lr = 2.0f, .warmup_steps = 0,
                            .total_steps = 100, .min_lr = 0.0f};
  CHECK(lr_at(o, 0) == 2.0f);
  CHECK(lr_at(o, 25) == doctest::Approx(1.5));
  CHECK(lr_at(o, 100) == 0.0f);
  CHECK(lr_at(o, 200) == 0.0f);
}

TEST_CASE("invalid schedules name the field") {
  const auto message = [](const LrScheduleOptions& o, int64_t step = 0) -> std::string {
    try {
      lr_at(o, step);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  CHECK(message({.kind = "step"}).find("kind: unknown LR schedule 'step'") == 0);
  CHECK(message({.base_lr = -1.f}).find("base_lr") == 0);
  CHECK(message({.base_lr = NAN}).find("base_lr") == 0);
  CHECK(message({.warmup_steps = -1}).find("warmup_steps") == 0);
  CHECK(message({.kind = "warmup_cosine", .base_lr = 1.f, .warmup_steps = 10, .total_steps = 10})
            .find("total_steps") == 0);
  CHECK(message({.kind = "warmup_linear", .base_lr = 1.f, .total_steps = 10, .min_lr = 2.f})
            .find("min_lr") == 0);
  CHECK(message({}, -1).find("step must be >= 0") == 0);
  CHECK_NOTHROW(validate_lr_schedule({.kind = "warmup_cosine", .total_steps = 1}));
}

}  // namespace
}  // namespace zero::optim
