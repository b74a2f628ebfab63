#include "parallel/strategy/predict.h"

#include "parallel/strategy/chart.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>

#include "base/error.h"

namespace zero::strategy {
namespace {

// Four equal layers; per micro-batch and layer: F, B, W of 1 ms each, 1000 bytes of activations
// (100 of weight work), one all-reduce of 4096 bytes each way under tp, 4096 bytes to the next stage.
class ToyCosts : public ModelCosts {
 public:
  std::string name() const override { return "toy"; }
  int sequence_length() const override { return 8; }
  std::string unsupported(const Layout& l, int global_batch) const override {
    if (4 % l.virtual_stages() != 0) return "pp x chunks does not divide the 4 layers";
    if (l.tp > 2) return "tp above 2";
    if (global_batch % (l.dp * l.micro_batches) != 0) return "the batch does not divide";
    return "";
  }
  uint64_t activation_scale = 1;  // the forward's activations times this
  int head_all_reduces = 0;        // under tp, the last virtual stage's extra forward all-reduces (a loss's)
  StageCosts stage(const Layout& l, int s, int, const Cluster&) const override {
    StageCosts c;
    const int per = 4 / l.virtual_stages();
    auto engine = std::make_shared<plan::ModelSpec>();
    engine->dtype = DType::kFloat32;
    for (int i = s * per; i < (s + 1) * per; ++i) {
      engine->tensors.push_back({"l" + std::to_string(i) + ".w", {64 / l.tp, 64}, i, true, 0,
                                 l.tp > 1 ? TpPlacement::split(0) : TpPlacement::replicated()});
    }
    c.engine = engine;
    c.units = 4;
    c.forward = c.backward_input = c.backward_weight = 1e-3 * per;
    if (l.tp > 1) {
      c.tp_forward.assign(static_cast<size_t>(per), {TpCollective::kAllReduce, 4096});
      c.tp_backward = c.tp_forward;
      if (s == l.virtual_stages() - 1) {
        c.tp_forward.insert(c.tp_forward.end(), static_cast<size_t>(head_all_reduces), {TpCollective::kAllReduce, 65536});
      }
    }
    c.send_bytes = 4096;
    // A layer holds 1000 bytes from its forward to its backward; a split backward's input part
    // keeps 800 of them for its weight part (its linear layers' inputs and output gradients).
    c.activation_bytes = 1000 * activation_scale * static_cast<uint64_t>(per);
    c.weight_bytes = 800 * activation_scale * static_cast<uint64_t>(per);
    if (l.recompute) {
      // A layer keeps 100 bytes of input; its backward runs its forward again, rebuilding 1000; an
      // input part trades each layer's input for its 800 in turn, peaking at the last rebuild.
      c.activation_bytes = 100 * static_cast<uint64_t>(per);
      c.weight_bytes = 800 * static_cast<uint64_t>(per);
      c.rebuilt_bytes = 1000;
      c.input_peak_bytes = 700 * static_cast<uint64_t>(per - 1) + 1000;
      c.backward_input += c.forward;
    }
    return c;
  }
};

Cluster cluster() {
  Cluster c;
  c.name = "test";
  c.devices_per_node = 8;
  c.device_memory = 1e12;
  c.peak_flops = 1e12;
  c.intra = {1e9, 0.0};
  c.inter = {1e8, 0.0};
  c.optimizer_rate = 1e9;
  return c;
}

PlanSettings settings() {
  PlanSettings s;
  s.engine.optimizer.kind = optim::OptimizerKind::kAdamW;
  s.engine.optimizer.groups = {optim::Hyper{.lr = 1e-3f}};
  s.global_batch = 16;
  return s;
}

TEST_CASE("one rank: the micro-batches one after another, one micro-batch of activations at a time") {
  const ToyCosts toy;
  const Prediction p = predict(toy, {.micro_batches = 2}, cluster(), settings());
  REQUIRE(p.unsupported.empty());
  CHECK(p.time.compute == doctest::Approx(2 * 4 * 3e-3));
  CHECK(p.time.bubble == 0.0);
  CHECK(p.time.dp_comm == 0.0);
  CHECK(p.time.optimizer == doctest::Approx(4 * 64 * 64 / 1e9));
  CHECK(p.memory.activations == 4000);
  CHECK(p.fits);
  CHECK(p.tokens_per_s == doctest::Approx(16 * 8 / p.time.step()));
}

TEST_CASE("pipelines: the simulator's bubble, and the activations each schedule holds on its first stage") {
  const ToyCosts toy;
  auto at = [&](const std::string& schedule, int m) {
    return predict(toy, {.pp = 4, .micro_batches = m, .schedule = schedule}, cluster(), settings());
  };
  // Equal stages, no transfer time worth counting: GPipe's bubble is (p - 1) / (m + p - 1).
  CHECK(at("gpipe", 4).bubble_fraction == doctest::Approx(3.0 / 7).epsilon(1e-3));
  CHECK(at("gpipe", 8).memory.activations == 8 * 1000);
  CHECK(at("1f1b", 8).memory.activations == 4 * 1000);
  CHECK(at("1f1b", 8).time.step() == doctest::Approx(at("gpipe", 8).time.step()).epsilon(1e-3));
  CHECK(at("zb-h1", 8).time.step() < at("1f1b", 8).time.step());
  // The zero-bubble schedules hold 1F1B's peak: ZB-H1 defers W's only as memory allows.
  CHECK(at("zb-h1", 8).memory.activations == 4 * 1000);
}

// `one` and the same layout under `schedule` with 2 chunks per rank, predicted on the toy: the same
// work per rank, a smaller bubble.
struct ChunkPair {
  Layout two;
  Prediction p1, p2;
};
ChunkPair with_two_chunks(const Layout& one, const std::string& schedule) {
  const ToyCosts toy;
  ChunkPair c{one, {}, {}};
  c.two.schedule = schedule;
  c.two.chunks = 2;
  c.p1 = predict(toy, one, cluster(), settings());
  c.p2 = predict(toy, c.two, cluster(), settings());
  REQUIRE(c.p2.unsupported.empty());
  CHECK(c.p2.time.compute == doctest::Approx(c.p1.time.compute));
  CHECK(c.p2.bubble_fraction < c.p1.bubble_fraction);
  return c;
}

TEST_CASE("zb-v: two chunks per rank in a V, at 1F1B's activation peak, below ZB-H1's bubble") {
  const ToyCosts toy;
  const ChunkPair c = with_two_chunks({.pp = 2, .micro_batches = 8, .schedule = "zb-h1"}, "zb-v");
  const Layout& v = c.two;
  const Prediction& pv = c.p2;
  // Rank 0 holds layers 0 and 3 (1000 bytes each): 1F1B's peak is 2 micro-batches of 2 layers.
  CHECK(pv.memory.activations == 2 * 2 * 1000);
  CHECK(layout_key(v) == "dp1.tp1.pp2.z0.m8.zb-v.v2");
  CHECK(parse_layout("pp=2,m=8,schedule=zb-v") == v);  // the schedule sets its 2 chunks
  CHECK_THROWS_WITH_AS(parse_layout("pp=2,m=8,chunks=4,schedule=zb-v"), doctest::Contains("2 chunks per rank in a V"),
                       InvalidArgument);
  const std::vector<Layout> all = enumerate_layouts(toy, 4, 16);
  CHECK(std::any_of(all.begin(), all.end(), [](const Layout& l) { return l.schedule == "zb-v"; }));
}

TEST_CASE("micro-batch counts: pp x 2^k where it divides the replica's batch, the next divisors where not") {
  // A power-of-two batch over a power-of-two pp: pp, 2 pp, 4 pp, ... as before.
  CHECK(micro_batch_counts(16, 2, 2) == std::vector<int>{2, 4, 8});
  CHECK(micro_batch_counts(16, 1, 1) == std::vector<int>{1, 2, 4, 8, 16});
  // BLOOM's 2048 over dp 8 and pp 12: no multiple of 12 divides 256, so the counts are the divisors
  // above 12, 24, 48, 96, 192 (its published 128 among them), none a multiple of pp.
  CHECK(micro_batch_counts(2048, 8, 12) == std::vector<int>{16, 32, 64, 128, 256});
  // 2520 over dp 9 and pp 35 (Megatron's 530B): 280 per replica; 35 divides it (the interleaved
  // schedule's multiple), and the smallest divisors at or above 70, 140 and 280.
  CHECK(micro_batch_counts(2520, 9, 35) == std::vector<int>{35, 70, 140, 280});
  // 24 over pp 5: targets 5, 10, 20; divisors 6, 12, 24; no multiple of 5 divides 24.
  CHECK(micro_batch_counts(24, 1, 5) == std::vector<int>{6, 12, 24});
  CHECK(micro_batch_counts(10, 3, 1).empty());  // dp 3 does not divide the batch
}

TEST_CASE("a stage's tp collectives are its rank's, in a V as in a loop") {
  // The last virtual stage's loss all-reduces: on rank 1 under 1F1B, on rank 0 under zb-v (which
  // holds the first and the last); the busiest rank, the one holding them, waits for them.
  for (const auto& kind : {std::pair<const char*, int>{"1f1b", 1}, std::pair<const char*, int>{"zb-v", 2}}) {
    const char* schedule = kind.first;  // (not a structured binding: clang cannot capture one)
    CAPTURE(schedule);
    const Layout l{.tp = 2, .pp = 2, .micro_batches = 4, .schedule = schedule, .chunks = kind.second};
    ToyCosts plain, loss;
    loss.head_all_reduces = 3;
    const Prediction a = predict(plain, l, cluster(), settings()), b = predict(loss, l, cluster(), settings());
    REQUIRE(a.unsupported.empty());
    CHECK(b.time.tp_comm > a.time.tp_comm);
  }
}

TEST_CASE("interleaved: a rank's chunks in the simulator and the replay; the search enumerates them") {
  const ToyCosts toy;
  const ChunkPair c = with_two_chunks({.pp = 2, .micro_batches = 4, .schedule = "1f1b"}, "interleaved");
  const Layout& two = c.two;
  const Prediction &p1 = c.p1, &p2 = c.p2;
  // Rank 0 holds layers 0 and 2 (1000 bytes per micro-batch each): its warm-up runs 4 forwards (2 per
  // chunk), the first steady forward a fifth, before its first backward.
  CHECK(p2.memory.activations == 5 * 1000);
  CHECK(p1.memory.activations == 2 * 2 * 1000);  // 1F1B: 2 micro-batches in flight of 2 layers
  const std::vector<Layout> all = enumerate_layouts(toy, 4, 16);
  CHECK(std::find(all.begin(), all.end(), Layout{.dp = 2, .pp = 2, .micro_batches = 4, .schedule = "interleaved", .chunks = 2}) !=
        all.end());
  for (const Layout& l : all) CHECK(l.virtual_stages() <= 4);  // the toy refuses more stages than layers
  CHECK(std::any_of(all.begin(), all.end(), [](const Layout& l) { return l.chunks > 1; }));
  CHECK(describe(two) == "dp 1 x tp 1 x pp 2, stage 0, interleaved x 4, 2 chunks");
  CHECK(layout_key(two) == "dp1.tp1.pp2.z0.m4.interleaved.v2");
  CHECK(parse_layout("pp=2,m=4,schedule=interleaved,chunks=2") == two);
  CHECK_THROWS_WITH_AS(parse_layout("pp=2,m=4,chunks=2"), doctest::Contains("go together"), InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_layout("pp=2,m=4,schedule=interleaved"), doctest::Contains("go together"), InvalidArgument);
}

TEST_CASE("recompute: the layers' inputs held, one rebuilt layer on top during a whole backward, a forward more") {
  const ToyCosts toy;
  auto at = [&](int pp, const std::string& schedule, int m, bool recompute) {
    return predict(toy, {.pp = pp, .micro_batches = m, .schedule = schedule, .recompute = recompute}, cluster(),
                   settings());
  };
  CHECK(at(1, "1f1b", 2, true).memory.activations == 4 * 100 + 1000);
  CHECK(at(4, "1f1b", 8, true).memory.activations == 4 * 100 + 1000);  // 4 in flight on the first stage
  CHECK(at(4, "gpipe", 8, true).memory.activations == 8 * 100 + 1000);
  // A split backward rebuilds a layer in its input part (on top of what is held) and keeps 800 of
  // it for its weight part; ZB-H1 stays within 1F1B's peak, its rebuild included.
  CHECK(at(4, "zb-h1", 8, true).memory.activations >= 4 * 100 + 1000 - 100);
  CHECK(at(4, "zb-h1", 8, true).memory.activations <= at(4, "1f1b", 8, true).memory.activations);
  CHECK(at(1, "1f1b", 2, true).time.compute == doctest::Approx(2 * 4 * 4e-3));
}

TEST_CASE("a search reports where it stands: layouts examined, floors within memory, planned, the best so far") {
  const ToyCosts toy;
  const std::vector<Layout> all = enumerate_layouts(toy, 4, 16);
  PlanSettings s = settings();
  s.progress_seconds = 0;  // every layout
  std::vector<SearchProgress> seen;
  s.progress = [&](const SearchProgress& p) { seen.push_back(p); };
  const std::vector<Prediction> ranked = rank_layouts(toy, all, cluster(), s, 3);
  // A report after each group of layouts sharing a simulation (those differing only in stage and
  // offload), and after each plan.
  std::set<std::string> groups;
  for (const Layout& l : all) {
    groups.insert(fmt::format("{}.{}.{}.{}.{}.{}.{}.{}", l.dp, l.tp, l.pp, l.micro_batches, l.schedule, l.chunks,
                              l.sequence_parallel, l.recompute));
  }
  REQUIRE(!seen.empty());
  REQUIRE(seen.size() >= groups.size() + seen.back().planned);
  for (size_t i = 1; i < seen.size(); ++i) {
    CHECK(seen[i].examined >= seen[i - 1].examined);
    CHECK(seen[i].planned >= seen[i - 1].planned);
    CHECK(!seen[i - 1].done);
  }
  const SearchProgress& last = seen.back();
  CHECK(last.done);
  CHECK(last.examined == all.size());
  CHECK(last.layouts == all.size());
  CHECK(last.planned >= 3);
  CHECK(last.fitting_floors >= last.planned);
  // The fastest planned (the ranking breaks its ties by memory; the progress keeps the first found).
  REQUIRE(last.best.has_value());
  CHECK(last.best_step == ranked.front().time.step());
  CHECK(std::any_of(ranked.begin(), ranked.end(), [&](const Prediction& p) {
    return p.fits && p.layout == *last.best && p.time.step() == last.best_step;
  }));
  CHECK(last.fastest_floor > 0);
  CHECK(last.fastest_floor <= last.best_step);
}

TEST_CASE("a search on several threads answers as on one; a time limit ranks what it reached and says so") {
  ToyCosts toy;
  toy.activation_scale = 1000;
  const std::vector<Layout> all = enumerate_layouts(toy, 4, 16);
  Cluster slow = cluster();
  slow.intra = slow.inter = {1e6, 1e-5};  // floors and steps apart: the pruning decides
  PlanSettings one = settings(), four = settings();
  four.threads = 4;
  for (size_t exact : {size_t{1}, size_t{5}, SIZE_MAX}) {
    CAPTURE(exact);
    const std::vector<Prediction> a = rank_layouts(toy, all, slow, one, exact), b = rank_layouts(toy, all, slow, four, exact);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      CHECK(a[i].layout == b[i].layout);
      CHECK(a[i].estimate == b[i].estimate);
      CHECK(a[i].time.step() == b[i].time.step());
      CHECK(a[i].memory.device() == b[i].memory.device());
      CHECK(a[i].unsupported == b[i].unsupported);
    }
  }
  // A limit reached at once: nothing examined, every supported layout named, none lost.
  PlanSettings limited = settings();
  limited.time_limit = 1e-9;
  const std::vector<Prediction> cut = rank_layouts(toy, all, slow, limited, 3);
  REQUIRE(cut.size() == all.size());
  size_t not_examined = 0;
  for (const Prediction& p : cut) not_examined += p.estimate == Estimate::kNotExamined ? 1 : 0;
  CHECK(not_examined > 0);
  CHECK(cut.back().estimate == Estimate::kNotExamined);  // ranked last
  CHECK_MESSAGE(reason(cut).find(fmt::format("{} layouts not examined", not_examined)) != std::string::npos, reason(cut));
  CHECK(table(cut, cut.size()).find("not examined (time limit)") != std::string::npos);
}

TEST_CASE("the search plans only what can fit, and shares plans without changing a prediction") {
  ToyCosts toy;
  toy.activation_scale = 1000;  // activations, not the engine, decide what fits
  const std::vector<Layout> all = enumerate_layouts(toy, 4, 16);
  // A device the median layout fills.
  std::vector<uint64_t> sizes;
  for (const Layout& l : all) sizes.push_back(predict(toy, l, cluster(), settings()).memory.device());
  std::sort(sizes.begin(), sizes.end());
  Cluster small = cluster();
  small.device_memory = static_cast<double>(sizes[sizes.size() / 2]);
  const std::vector<Prediction> ranked = rank_layouts(toy, all, small, settings());
  REQUIRE(ranked.size() == all.size());
  size_t bounded = 0, fitting = 0;
  for (const Prediction& p : ranked) {
    CAPTURE(describe(p.layout));
    const Prediction alone = predict(toy, p.layout, small, settings());
    CHECK(p.estimate != Estimate::kTooSlow);  // everything ranked exactly
    if (p.estimate == Estimate::kTooLarge) {
      ++bounded;
      CHECK(!p.fits);
      CHECK(!alone.fits);
      CHECK(p.memory.device() <= alone.memory.device());  // a floor
      CHECK(p.memory.activations == alone.largest_activations);
    } else {
      fitting += p.fits ? 1 : 0;
      CHECK(p.memory.device() == alone.memory.device());
      CHECK(p.time.step() == alone.time.step());
    }
  }
  CHECK(bounded > 0);
  CHECK(fitting > 0);
  // Nothing fits: the smallest is planned, and it is the smallest of all.
  small.device_memory = 1000;
  const std::vector<Prediction> none = rank_layouts(toy, all, small, settings());
  REQUIRE(!none.front().fits);
  CHECK(none.front().estimate == Estimate::kExact);
  for (const Prediction& p : none) CHECK(none.front().memory.device() <= p.memory.device());
  CHECK(table(none, 1000).find("does not fit (at least)") != std::string::npos);
}

TEST_CASE("asked for the first k exactly, the search ranks them as planning everything would, the rest by floors") {
  const ToyCosts toy;
  const std::vector<Layout> all = enumerate_layouts(toy, 4, 16);
  Cluster slow_link = cluster();
  slow_link.intra = {1e7, 1e-4};  // the dp collectives matter: floors differ from steps
  const std::vector<Prediction> every = rank_layouts(toy, all, slow_link, settings());
  for (size_t k : {1, 5, 20}) {
    CAPTURE(k);
    const std::vector<Prediction> first = rank_layouts(toy, all, slow_link, settings(), k);
    REQUIRE(first.size() == every.size());
    for (size_t i = 0; i < k; ++i) {
      CAPTURE(i);
      CHECK(first[i].layout == every[i].layout);
      CHECK(first[i].time.step() == every[i].time.step());
      CHECK(first[i].estimate == Estimate::kExact);
    }
    size_t slower = 0;
    for (const Prediction& p : first) {
      if (p.estimate != Estimate::kTooSlow) continue;
      ++slower;
      CAPTURE(describe(p.layout));
      const Prediction alone = predict(toy, p.layout, slow_link, settings());
      CHECK(p.time.step() <= alone.time.step());             // a floor
      CHECK(p.time.step() > first[k - 1].time.step());       // that cannot rank among the first k
      CHECK(p.memory.device() <= alone.memory.device());
      CHECK(p.memory.activations == alone.largest_activations);
      CHECK(!p.fits);
    }
    CHECK(slower > 0);  // something was not planned
    CHECK(table(first, first.size()).find("slower (at least)") != std::string::npos);
    CHECK(reason(first).find("more whose floors are slower") != std::string::npos);
  }
}

TEST_CASE("tensor-parallel collectives by the ring formula; ranks beyond a machine's shared cores run slower, a pipeline's less") {
  const ToyCosts toy;
  const Prediction tp = predict(toy, {.tp = 2}, cluster(), settings());
  // Per layer and direction: an all-reduce of 4096 bytes over 2 ranks at 1e9 bytes/s.
  CHECK(tp.time.tp_comm == doctest::Approx(4 * 2 * (2 * 0.5 * 4096 / 1e9)));
  Cluster shared = cluster();
  shared.devices_per_node = 2;
  shared.shared_cores = true;
  const Prediction four = predict(toy, {.dp = 4}, shared, settings());
  const Prediction two = predict(toy, {.dp = 2}, shared, settings());
  CHECK(four.time.compute == doctest::Approx(2 * two.time.compute));
  CHECK(four.time.dp_exposed == four.time.dp_comm);  // nothing overlaps on shared cores
  // A pipeline shares the cores instead: a rank in its bubble frees its share, so 4 stages on 2
  // cores cost more than on 4 devices but less than every action at half speed.
  Cluster own = shared;
  own.devices_per_node = 4;
  own.shared_cores = false;
  const Layout pp4{.pp = 4, .micro_batches = 4};
  const Prediction on_two = predict(toy, pp4, shared, settings());
  const Prediction on_four = predict(toy, pp4, own, settings());
  const double step2 = on_two.time.compute + on_two.time.bubble, step4 = on_four.time.compute + on_four.time.bubble;
  CHECK(step2 > step4);
  CHECK(step2 < 2 * step4);
}

TEST_CASE("waits for the slowest rank: at each reducing micro-step and each all-gather with dp, at each tp collective, at each pipeline receive") {
  const ToyCosts toy;
  Cluster c = cluster();
  c.sync = {.latency = 1e-4, .fraction = 0.1};
  auto both = [&](const Layout& l) { return std::make_pair(predict(toy, l, cluster(), settings()), predict(toy, l, c, settings())); };
  {
    // One rank: nothing synchronizes its compute.
    const auto [without, with] = both(Layout{});
    CHECK(with.time.syncs == 0);
    CHECK(with.time.sync == 0);
    CHECK(with.time.step() == without.time.step());
  }
  {
    // A pipeline of 2 stages and 2 micro-batches: each stage waits for 2 receives (the second its
    // activations, the first their gradients), and for its sender's delays over its own compute.
    const Layout pp2{.pp = 2, .micro_batches = 2};
    const auto [without, with] = both(pp2);
    CHECK(with.time.syncs == 2);
    CHECK(with.time.sync > 2e-4);
    CHECK(with.time.sync < 2e-4 + 0.1 * with.time.compute + 1e-12);
    CHECK(with.time.step() == doctest::Approx(without.time.step() + with.time.sync));
  }
  // dp 2 at stage 0, one micro-batch: its reduction, once per step, after the whole compute.
  const auto [z0_without, z0] = both(Layout{.dp = 2, .stage = 0});
  CHECK(z0.time.syncs == 1);
  CHECK(z0.time.sync == doctest::Approx(1e-4 + 0.1 * z0.time.compute));
  CHECK(z0.time.step() == doctest::Approx(z0_without.time.step() + z0.time.sync));
  CHECK(explain(z0).find("waits for the slowest rank") != std::string::npos);
  CHECK(explain(z0_without).find("waits for the slowest rank") == std::string::npos);
  // Stage 1: and the update's two all-gathers (the block sums before the norm, the updated
  // parameters before the next forward: the toy's one bucket).
  const auto [z1_without, z1] = both(Layout{.dp = 2, .stage = 1});
  CHECK(z1.time.syncs == 3);
  CHECK(z1.time.sync == doctest::Approx(3e-4 + 0.1 * z1.time.compute));
  CHECK(z1.time.step() == doctest::Approx(z1_without.time.step() + z1.time.sync));
  // Micro-steps: each reduces at its end (the engine's default), and the compute waits for it.
  const Prediction m4 = predict(toy, {.dp = 2, .stage = 1, .micro_batches = 4}, c, settings());
  CHECK(m4.time.syncs == 4 + 2);
  CHECK(m4.time.sync == doctest::Approx(6e-4 + 0.1 * m4.time.compute));
  PlanSettings deferred = settings();
  deferred.engine.micro_batch_reduce = MicroBatchReduce::kOnce;  // only the last micro-step reduces
  CHECK(predict(toy, {.dp = 2, .stage = 1, .micro_batches = 4}, c, deferred).time.syncs == 1 + 2);
  // Stage 3: each unit's all-gather, forward and backward (4 units, the one the backward starts
  // with kept from the forward or not: at least 7 gathers), and the block sums'.
  const Prediction z3 = predict(toy, {.dp = 2, .stage = 3}, c, settings());
  CHECK(z3.time.syncs >= 1 + 7 + 1);
  CHECK(z3.time.sync == doctest::Approx(1e-4 * z3.time.syncs + 0.1 * z3.time.compute));
  CHECK(z3.time.sync > z1.time.sync);
  // tp 2 priced from the link: each of its 8 collectives (4 layers, forward and backward).
  const auto [tp_without, tp] = both(Layout{.tp = 2});
  CHECK(tp.time.syncs == 8);
  CHECK(tp.time.step() == doctest::Approx(tp_without.time.step() + 8e-4 + 0.1 * tp.time.compute));
}

TEST_CASE("over one data-parallel rank an all-gather or a reduce-scatter still copies its payload") {
  const ToyCosts toy;
  Cluster c = cluster();
  c.shared_cores = true;  // nothing hides the copies: the step pays them whole
  auto copies = [&](int stage, std::optional<Link> copy) {
    c.copy = copy;
    return predict(toy, {.stage = stage}, c, settings());
  };
  // Absent from the cluster file: free, as before.
  CHECK(copies(3, std::nullopt).time.dp_comm == 0);
  // Stage 0's all-reduce works in place: nothing to copy.
  CHECK(copies(0, Link{1e9, 1e-6}).time.dp_comm == 0);
  // Stage 3 fills its window from the shard at every gather (4 units of 64 x 64 floats, each gathered
  // at least once a step) and reduce-scatters each unit's gradients: each payload once at the
  // bandwidth, each call its latency.
  const Prediction z3 = copies(3, Link{1e9, 0}), z3_fast = copies(3, Link{2e9, 0});
  CHECK(z3.time.dp_comm >= (4 + 4) * 64 * 64 * 4 / 1e9);
  CHECK(z3_fast.time.dp_comm == doctest::Approx(z3.time.dp_comm / 2));
  const double calls = (copies(3, Link{1e9, 1e-6}).time.dp_comm - z3.time.dp_comm) / 1e-6;
  CHECK(calls == doctest::Approx(std::round(calls)));
  CHECK(calls >= 4 + 4);
  const Prediction z0 = copies(0, Link{1e9, 0});
  CHECK(z3.time.dp_exposed == doctest::Approx(z3.time.dp_comm));
  CHECK(z3.time.step() == doctest::Approx(z0.time.step() + z3.time.dp_comm));
  // Over two ranks the link prices them, the copy bandwidth nothing.
  CHECK(predict(toy, {.dp = 2, .stage = 3}, c, settings()).time.dp_comm ==
        doctest::Approx(predict(toy, {.dp = 2, .stage = 3}, cluster(), settings()).time.dp_comm));
}

TEST_CASE("the search: every supported layout, those that fit first; none fitting names the smallest") {
  const ToyCosts toy;
  const std::vector<Layout> all = enumerate_layouts(toy, 4, 16);
  for (const Layout& l : all) {
    CHECK(l.world() == 4);
    CHECK(l.tp <= 2);
  }
  CHECK(std::find(all.begin(), all.end(), Layout{.dp = 2, .tp = 2, .stage = 3, .micro_batches = 2}) != all.end());
  const std::vector<Prediction> ranked = rank_layouts(toy, all, cluster(), settings());
  REQUIRE(ranked.size() == all.size());
  CHECK(ranked.front().fits);
  for (size_t i = 1; i < ranked.size(); ++i) {
    if (ranked[i].fits) CHECK(ranked[i - 1].time.step() <= ranked[i].time.step());
  }
  CHECK(reason(ranked).find("the fastest of") != std::string::npos);
  Cluster tiny = cluster();
  tiny.device_memory = 1000;
  const std::vector<Prediction> none = rank_layouts(toy, all, tiny, settings());
  CHECK(!none.front().fits);
  CHECK(reason(none).find("no layout fits: the smallest") != std::string::npos);
  CHECK(explain(ranked.front()).find("time per step") != std::string::npos);
  CHECK(table(ranked, 5).find("tokens/s") != std::string::npos);
  // The frontier: fitting layouts, each smaller than the next and faster than every smaller one.
  const std::vector<const Prediction*> f = frontier(ranked);
  REQUIRE(!f.empty());
  CHECK(f.back()->time.step() == ranked.front().time.step());
  for (size_t i = 1; i < f.size(); ++i) {
    CHECK(f[i - 1]->memory.device() <= f[i]->memory.device());
    CHECK(f[i - 1]->time.step() > f[i]->time.step());
  }
  const std::string svg = frontier_svg(ranked, 1e12, "toy");
  CHECK(svg.find("<polyline") != std::string::npos);
  CHECK(svg.find("fastest: " + describe(f.back()->layout)) != std::string::npos);
}

}  // namespace
}  // namespace zero::strategy
