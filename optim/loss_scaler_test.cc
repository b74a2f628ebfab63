// Dynamic loss scaler: DeepSpeed's sequence of hysteresis, backoff, growth and skips.
#include "optim/loss_scaler.h"

#include <doctest/doctest.h>

#include <string>

#include "base/error.h"

namespace zero::optim {
namespace {

TEST_CASE("defaults: 2^16, hysteresis 2, backoff 0.5, growth x2 after 2000 good steps") {
  DynamicLossScaler s;
  CHECK(s.scale() == 65536.f);
  CHECK(s.inv_scale() == 1.f / 65536.f);
  CHECK(s.hysteresis_left() == 2);

  // First overflow: consumes hysteresis, scale kept, step skipped.
  CHECK(s.update(true));
  CHECK(s.scale() == 65536.f);
  CHECK(s.hysteresis_left() == 1);
  // Second overflow: backs off.
  CHECK(s.update(true));
  CHECK(s.scale() == 32768.f);
  // Hysteresis is not restored by good steps (DeepSpeed's default): the next overflow backs off at once.
  CHECK_FALSE(s.update(false));
  CHECK(s.good_steps_since_growth() == 1);
  CHECK(s.update(true));
  CHECK(s.scale() == 16384.f);
  CHECK(s.good_steps_since_growth() == 0);
  CHECK(s.skipped_steps() == 3);

  // 1999 good steps: no growth yet; the 2000th grows and restores hysteresis.
  for (int i = 0; i < 1999; ++i) CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 16384.f);
  CHECK(s.good_steps_since_growth() == 1999);
  CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 32768.f);
  CHECK(s.good_steps_since_growth() == 0);
  CHECK(s.hysteresis_left() == 2);
  // Hysteresis is back: one overflow is absorbed again.
  CHECK(s.update(true));
  CHECK(s.scale() == 32768.f);
  CHECK(s.skipped_steps() == 4);
  CHECK(s.steps() == 2000 + 3 + 1 + 1);
}

TEST_CASE("consecutive_hysteresis: good steps restore it, only overflows in a row back off") {
  DynamicLossScaler s(LossScalerOptions{.initial_scale = 1024.f, .growth_interval = 100,
                                        .hysteresis = 3, .consecutive_hysteresis = true});
  for (int round = 0; round < 5; ++round) {
    CHECK(s.update(true));
    CHECK(s.update(true));
    CHECK_FALSE(s.update(false));
  }
  CHECK(s.scale() == 1024.f);
  CHECK(s.update(true));
  CHECK(s.update(true));
  CHECK(s.update(true));  // third in a row
  CHECK(s.scale() == 512.f);
  CHECK(s.skipped_steps() == 13);
}

TEST_CASE("min_scale floor and growth interval 1") {
  DynamicLossScaler s(LossScalerOptions{.initial_scale = 4.f, .growth_interval = 1, .hysteresis = 1,
                                        .min_scale = 1.f});
  CHECK(s.update(true));
  CHECK(s.scale() == 2.f);
  CHECK(s.update(true));
  CHECK(s.update(true));
  CHECK(s.update(true));
  CHECK(s.scale() == 1.f);
  CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 2.f);
  CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 4.f);
}

TEST_CASE("scale never grows to infinity") {
  DynamicLossScaler s(LossScalerOptions{.initial_scale = 3e38f, .growth_interval = 1});
  CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 3e38f);
}

TEST_CASE("state round trip resumes exactly") {
  DynamicLossScaler a;
  a.update(true);
  for (int i = 0; i < 10; ++i) a.update(false);
  DynamicLossScaler b;
  b.set_state(a.state());
  for (int i = 0; i < 3000; ++i) {
    const bool overflow = i % 1700 == 5;
    CHECK(a.update(overflow) == b.update(overflow));
    REQUIRE(a.scale() == b.scale());
  }
  CHECK(a.skipped_steps() == b.skipped_steps());
}

TEST_CASE("invalid options name the field") {
  const auto message = [](LossScalerOptions o) -> std::string {
    try {
      DynamicLossScaler s(o);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  CHECK(message({.initial_scale = 0.f}).find("initial_scale") == 0);
  CHECK(message({.growth_factor = 0.5f}).find("growth_factor") == 0);
  CHECK(message({.backoff_factor = 1.5f}).find("backoff_factor") == 0);
  CHECK(message({.backoff_factor = 0.f}).find("backoff_factor") == 0);
  CHECK(message({.growth_interval = 0}).find("growth_interval") == 0);
  CHECK(message({.hysteresis = 0}).find("hysteresis") == 0);
  CHECK(message({.min_scale = 0.f}).find("min_scale") == 0);
  CHECK(message({.initial_scale = 2.f, .min_scale = 4.f}).find("min_scale") == 0);
  DynamicLossScaler s;
  CHECK_THROWS_AS(s.set_state(LossScalerState{.scale = -1.f}), InvalidArgument);
}

}  // namespace
}  // namespace zero::optim
