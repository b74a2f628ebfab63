// The generated schedules pass the checker at every size, and their simulation with unit costs
// gives the known closed forms: bubble (p-1)/(m+p-1) of the step for GPipe and 1F1B, divided by v
// (as (p-1)/(vm+p-1)) for interleaved 1F1B, a third of 1F1B's for ZB-H1 when F = B = W; peak
// micro-batches in flight p-s at stage s for 1F1B (and ZB-H1), m for GPipe. The zero-bubble
// schedules hold at most 1F1B's peak of activations, in any unit the sizes are given in.
#include "parallel/pipeline/schedules.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "parallel/pipeline/pipeline_check.h"
#include "parallel/pipeline/schedule_sim.h"

namespace zero::parallel {
namespace {

TEST_CASE("every generated schedule passes the checker, p 1-8, m 1-32") {
  int checked = 0;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      for (const char* name : {"gpipe", "1f1b", "zb-h1"}) {
        CAPTURE(name);
        CHECK_NOTHROW(check_schedule(make_schedule(name, p, m)));
        ++checked;
      }
      CHECK_NOTHROW(check_schedule(make_schedule("zb-v", p, m, 2)));
      ++checked;
      if (m % p != 0) continue;
      for (int v : {1, 2, 3, 4}) {
        CAPTURE(v);
        CHECK_NOTHROW(check_schedule(interleaved_1f1b(p, m, v)));
        ++checked;
      }
    }
  }
  CHECK(checked > 1000);
}

ActionCosts unit() { return {}; }  // F = B = W = 1, transfers free

TEST_CASE("GPipe and 1F1B: bubble (p-1)/(m+p-1); peak in flight m and p-s") {
  for (int p : {1, 2, 4, 8}) {
    for (int m : {1, 4, 8, 16, 32}) {
      CAPTURE(p);
      CAPTURE(m);
      const double closed = (p - 1.0) / (m + p - 1.0);
      const SimResult g = simulate(gpipe(p, m), unit());
      const SimResult o = simulate(one_f_one_b(p, m), unit());
      CHECK(g.bubble_fraction == doctest::Approx(closed).epsilon(1e-12));
      CHECK(o.bubble_fraction == doctest::Approx(closed).epsilon(1e-12));
      CHECK(o.step_time == doctest::Approx(3.0 * (m + p - 1)));
      for (int s = 0; s < p; ++s) {
        CHECK(g.peak_in_flight[static_cast<size_t>(s)] == m);
        CHECK(o.peak_in_flight[static_cast<size_t>(s)] == std::min(p - s, m));
      }
    }
  }
}

TEST_CASE("interleaved 1F1B: the bubble divided by v") {
  for (int p : {2, 4, 8}) {
    for (int v : {1, 2, 4}) {
      for (int m : {p, 2 * p, 4 * p}) {
        CAPTURE(p);
        CAPTURE(v);
        CAPTURE(m);
        // Each chunk's costs 1/v of the rank's layers: a bubble of (p-1)/v micro-batch times.
        ActionCosts c;
        c.forward = {1.0 / v};
        c.backward = {1.0 / v};
        c.weight = {1.0 / v};
        const SimResult r = simulate(interleaved_1f1b(p, m, v), c);
        CHECK(r.bubble_fraction == doctest::Approx((p - 1.0) / (v * m + p - 1.0)).epsilon(1e-9));
      }
    }
  }
}

TEST_CASE("ZB-H1: about a third of 1F1B's bubble when F = B = W, at 1F1B's activations in flight") {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p, 32}) {
      CAPTURE(p);
      CAPTURE(m);
      const SimResult z = simulate(zb_h1(p, m), unit());
      const SimResult o = simulate(one_f_one_b(p, m), unit());
      const double idle_z = z.step_time - 3.0 * m, idle_o = o.step_time - 3.0 * m;  // per rank
      CHECK(idle_o == doctest::Approx(3.0 * (p - 1)));
      CHECK(idle_z == doctest::Approx(1.0 * (p - 1)));  // (p-1)(F + B - W)
      for (int s = 0; s < p; ++s) CHECK(z.peak_in_flight[static_cast<size_t>(s)] <= p - s);
    }
  }
}

// What a micro-batch holds per virtual stage of a model of `layers` even layers cut into `stages`:
// 10 per layer after its forward, `ratio` of that kept for a deferred W; the last stage's head adds
// 2.5 (1.5 for its W), the first stage's embedding keeps 1 for its W only.
HeldBytes model_sizes(int stages, int layers, double ratio) {
  HeldBytes h;
  h.forward.clear();
  h.weight.clear();
  const double per = 10.0 * layers / stages;
  for (int k = 0; k < stages; ++k) {
    h.forward.push_back(per + (k == stages - 1 ? 2.5 : 0.0));
    h.weight.push_back(per * ratio + (k == stages - 1 ? 1.5 : 0.0) + (k == 0 ? 1.0 : 0.0));
  }
  return h;
}

TEST_CASE("held activations: 1F1B holds p-s micro-batches, GPipe m; the replay follows each action") {
  for (int p : {1, 2, 4}) {
    for (int m : {1, 4, 8}) {
      const std::vector<double> o = peak_held(one_f_one_b(p, m), HeldBytes{});
      const std::vector<double> g = peak_held(gpipe(p, m), HeldBytes{});
      for (int s = 0; s < p; ++s) {
        CHECK(o[static_cast<size_t>(s)] == std::min(p - s, m));
        CHECK(g[static_cast<size_t>(s)] == m);
      }
      CHECK(one_f_one_b_peak(HeldBytes{}, p, 1, m) == std::min(p, m));
    }
  }
  // By hand: F0 F1 then B0 (keeps 0.5 for its W) and W0, at p 1.
  const Schedule z = zb_h1(1, 2);
  HeldTracker t(z, HeldBytes{.forward = {2.0}, .weight = {0.5}, .rebuilt = {0.0}, .input_peak = {3.0}}, 0);
  t.apply({Op::kF, 0, 0});
  CHECK(t.now() == 2.0);
  CHECK(t.high_water({Op::kB, 0, 0}) == 5.0);  // the input part's moment on top of what is held
  t.apply({Op::kB, 0, 0});
  CHECK(t.now() == 0.5);
  CHECK(t.peak() == 5.0);
  t.apply({Op::kW, 0, 0});
  CHECK(t.now() == 0.0);
  CHECK_THROWS_WITH_AS(peak_held(one_f_one_b(2, 2), HeldBytes{.forward = {1, 2, 3}}),
                       doctest::Contains("3 values of HeldBytes.forward for 2 virtual stages"), InvalidArgument);
  CHECK_THROWS_WITH_AS(peak_held(one_f_one_b(2, 2), HeldBytes{.weight = {-1}}),
                       doctest::Contains("HeldBytes.weight has -1"), InvalidArgument);
}

TEST_CASE("ZB-H1 keeps 1F1B's peak of held activations in bytes, with its bubble below 1F1B's") {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      for (double ratio : {0.5, 0.9}) {  // (a W keeping more than a forward: below)
        CAPTURE(p);
        CAPTURE(m);
        CAPTURE(ratio);
        ActionCosts c;
        c.held = model_sizes(p, 4 * p, ratio);
        const double bound = one_f_one_b_peak(c.held, p, 1, m);
        const SimResult z = simulate(zb_h1(p, m, c), c), o = simulate(one_f_one_b(p, m), c);
        CHECK(*std::max_element(o.peak_held.begin(), o.peak_held.end()) == doctest::Approx(bound));
        for (double held : z.peak_held) CHECK(held <= bound * (1 + 1e-12));
        CHECK(z.bubble_fraction < o.bubble_fraction);
      }
    }
  }
  // A deferred W that keeps more than a forward: a B cannot stay under the bound, so W's run at
  // once; the peak passes it by at most one W's excess.
  HeldBytes heavy{.forward = {1.0}, .weight = {1.25}};
  const std::vector<double> peaks = peak_held(zb_h1(4, 8, ActionCosts{.held = heavy}), heavy);
  for (double held : peaks) CHECK(held <= 4.0 + 0.25);
}

TEST_CASE("ZB-V: rank s holds virtual stages s and 2p-1-s; its bubble below ZB-H1's at about 1F1B's peak") {
  const Schedule v = zb_v(4, 8);
  CHECK(v.placement == Placement::kV);
  CHECK(v.chunks == 2);
  for (int r = 0; r < 4; ++r) {
    CHECK(v.virtual_stage(r, 0) == r);
    CHECK(v.virtual_stage(r, 1) == 7 - r);
    for (int c = 0; c < 2; ++c) {
      CHECK(v.rank_of(v.virtual_stage(r, c)) == r);
      CHECK(v.chunk_of(v.virtual_stage(r, c)) == c);
    }
  }
  // Rank 3 hands its chunk 0's output to its own chunk 1; rank 0's chunk 1 is the last stage.
  CHECK(!v.sends_forward(3, 0));
  CHECK(!v.receives_forward(3, 1));
  CHECK(!v.sends_forward(0, 1));
  for (int p : {2, 4, 8}) {
    for (int m : {2 * p, 4 * p}) {
      for (double ratio : {0.5, 0.9}) {
        CAPTURE(p);
        CAPTURE(m);
        CAPTURE(ratio);
        // Each chunk half a rank's layers: half the time and half the bytes of ZB-H1's stages.
        ActionCosts half;
        half.forward = half.backward = half.weight = {0.5};
        half.held = model_sizes(2 * p, 4 * p, ratio);
        ActionCosts whole;
        whole.held = model_sizes(p, 4 * p, ratio);
        const SimResult zv = simulate(zb_v(p, m), half);
        const SimResult zh = simulate(zb_h1(p, m, whole), whole);
        CHECK(zv.bubble_fraction < zh.bubble_fraction);
        // 1F1B's peak, or rank 0's fill of the pipeline (2p-1 forwards of the first chunk, one of
        // the heavier last) where that is more; within 10% of 1F1B's peak.
        const double one_f_one_b = one_f_one_b_peak(half.held, p, 2, m);
        const double fill = (2 * p - 1) * half.held.forward.front() + half.held.forward.back();
        for (double held : zv.peak_held) {
          CHECK(held <= std::max(one_f_one_b, fill) * (1 + 1e-12));
          CHECK(held <= 1.1 * one_f_one_b);
        }
      }
    }
  }
}

TEST_CASE("uneven stages and transfer costs move the step as they should") {
  // A slow last stage: 1F1B's step is bounded below by that stage's work.
  ActionCosts c;
  c.forward = {1, 1, 1, 3};
  c.backward = {1, 1, 1, 3};
  c.weight = {1, 1, 1, 3};
  const SimResult r = simulate(one_f_one_b(4, 8), c);
  CHECK(r.step_time >= 8 * 9.0);
  CHECK(r.idle[3] < r.idle[0]);
  // Transfers add to the critical path: at least 2(p-1) of them at the start and the end.
  ActionCosts t;
  t.transfer = 0.5;
  CHECK(simulate(one_f_one_b(4, 8), t).step_time >= simulate(one_f_one_b(4, 8), unit()).step_time + 2 * 3 * 0.5);
}

// Shared cores (processor sharing): with one core and free transfers some rank can always run, so
// the step is all ranks' work end to end; a schedule that keeps one rank busy at a time (GPipe with
// one micro-batch) costs what it costs unshared; otherwise the step is at least the unshared one
// (no action runs faster) and at least the work divided by the cores.
TEST_CASE("shared cores: one core runs all the work end to end; a rank in its bubble frees its share") {
  for (int p : {2, 3, 4}) {
    for (int m : {1, 4, 8}) {
      CAPTURE(p);
      CAPTURE(m);
      std::vector<Schedule> schedules{gpipe(p, m), one_f_one_b(p, m), make_schedule("zb-h1", p, m)};
      if (m % p == 0) schedules.push_back(interleaved_1f1b(p, m, 2));
      for (const Schedule& s : schedules) {
        CAPTURE(s.name);
        ActionCosts c;
        c.forward = {1.0};
        c.backward = {2.0};
        c.weight = {0.5};
        const SimResult alone = simulate(s, c);
        double work = 0;
        for (double b : alone.busy) work += b;
        const SimResult one = simulate(s, c, 1.0);
        CHECK(one.step_time == doctest::Approx(work).epsilon(1e-9));
        for (double cores : {1.5, p / 2.0}) {
          if (cores >= p) continue;
          CAPTURE(cores);
          const SimResult shared = simulate(s, c, cores);
          CHECK(shared.step_time >= alone.step_time * (1 - 1e-9));
          CHECK(shared.step_time >= work / cores * (1 - 1e-9));
          for (size_t r = 0; r < shared.timeline.size(); ++r) {
            double busy = 0, last = 0;
            for (const Span& span : shared.timeline[r]) {
              CHECK(span.start >= last - 1e-9);
              busy += span.end - span.start;
              last = span.end;
            }
            CHECK(busy == doctest::Approx(shared.busy[r]).epsilon(1e-9));
            CHECK(shared.peak_in_flight[r] == alone.peak_in_flight[r]);
          }
        }
        // As many cores as ranks: each has its own.
        CHECK(simulate(s, c, p).step_time == alone.step_time);
        // The planner's path for a schedule it checked once: the same result, shared cores or not.
        for (double cores : {0.0, 1.5}) {
          const SimResult checked = simulate_checked(s, c, cores), full = simulate(s, c, cores);
          CHECK(checked.step_time == full.step_time);
          CHECK(checked.busy == full.busy);
          CHECK(checked.peak_in_flight == full.peak_in_flight);
        }
      }
    }
  }
  // One micro-batch through GPipe: one rank computes at a time, so one core is enough.
  const SimResult chain = simulate(gpipe(4, 1), unit(), 1.0);
  CHECK(chain.step_time == doctest::Approx(simulate(gpipe(4, 1), unit()).step_time));
  CHECK_THROWS_WITH_AS(simulate(gpipe(2, 2), unit(), -1.0), doctest::Contains("-1 cores"), InvalidArgument);
  CHECK_THROWS_WITH_AS(simulate_checked(gpipe(2, 2), unit(), -1.0), doctest::Contains("-1 cores"), InvalidArgument);
}

TEST_CASE("bad parameters are refused naming them") {
  CHECK_THROWS_WITH_AS(interleaved_1f1b(4, 6, 2),
                       doctest::Contains("6 micro-batches are not a multiple of the 4 pipeline ranks"), InvalidArgument);
  CHECK_THROWS_WITH_AS(interleaved_1f1b(4, 8, 2, 12), doctest::Contains("12 layers do not split into 4 ranks x 2 chunks"),
                       InvalidArgument);
  CHECK_NOTHROW(interleaved_1f1b(4, 8, 2, 16));
  CHECK_THROWS_WITH_AS(one_f_one_b(0, 8), doctest::Contains("0 pipeline ranks"), InvalidArgument);
  CHECK_THROWS_WITH_AS(gpipe(2, 0), doctest::Contains("0 micro-batches"), InvalidArgument);
  CHECK_THROWS_WITH_AS(make_schedule("1f1b", 2, 4, 2), doctest::Contains("'1f1b' runs one chunk per rank: 2 chunks"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(make_schedule("zb-v", 2, 4), doctest::Contains("'zb-v' runs 2 chunks per rank in a V, not 1"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(make_schedule("zb-v1", 2, 4), doctest::Contains("unknown pipeline schedule 'zb-v1'"),
                       InvalidArgument);
  ActionCosts c;
  c.forward = {1, 2, 3};
  CHECK_THROWS_WITH_AS(simulate(gpipe(2, 2), c), doctest::Contains("3 costs given for 2 virtual stages"), InvalidArgument);
}

}  // namespace
}  // namespace zero::parallel
