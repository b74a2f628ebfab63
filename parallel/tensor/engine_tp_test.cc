// The engine under tensor parallelism, every rank a thread (Gloo over one in-memory store), on a
// comm::Mesh of dp x tp: parameters registered as their tp parts (split rows, split columns, q|k|v
// blocks, replicated, replicated with partial gradients, several of them in different buckets: their
// sums over tp go packed into one call) train exactly as the whole tensors do on
// one rank: the same global gradient norm (each element counted once), the same clipped AdamW
// steps, at every stage. Also: replicated parameters whose values differ across tp (the sign of a
// split tensor registered without its placement) and ranks that disagree on a placement fail at
// finalize() naming the parameter; a checkpoint saved at one (dp, tp)
// layout and stage loads at another (its pieces are tensor-parallel parts) and training goes on.
// Muon and Adafactor, whose updates need the whole tensor, train split tensors as the whole ones
// (Muon part by part where asked).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/hybrid_groups.h"
#include "comm/mesh.h"
#include "memory/device.h"
#include "parallel/engine_comms.h"
#include "testing/thread_ranks.h"
#include "optim/newton_schulz.h"
#include "zero/engine.h"
#include "zero/tp_placement.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

struct TensorDef {
  std::string name;
  std::vector<int64_t> shape;  // the whole tensor's
  TpPlacement tp;
  int unit = 0;
  int group = 0;  // the matrices' group: 1
};

const std::vector<TensorDef>& model() {
  static const std::vector<TensorDef> m = {
      {"fc.w", {8, 6}, TpPlacement::split(0), 0, 1},
      {"fc.norm", {5}, TpPlacement::replicated_partial(), 0, 0},
      {"fc.b", {8}, TpPlacement::split(0), 0, 0},
      {"attn.qkv", {12, 6}, TpPlacement::split(0, 3), 0, 1},
      {"proj.w", {6, 8}, TpPlacement::split(1), 1, 1},
      {"proj.b", {6}, TpPlacement::replicated(), 1, 0},
      {"ln.w", {6}, TpPlacement::replicated_partial(), 1, 0},
      {"ln.b", {6}, TpPlacement::replicated_partial(), 1, 0},
  };
  return m;
}

size_t numel(const std::vector<int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), size_t{1}, [](size_t a, int64_t d) { return a * static_cast<size_t>(d); });
}

// Whole initial values and whole gradients (of a step), the same at any layout.
std::vector<float> initial(size_t t) {
  std::vector<float> v(numel(model()[t].shape));
  for (size_t e = 0; e < v.size(); ++e) v[e] = std::cos(0.3f * static_cast<float>(e) + static_cast<float>(t));
  return v;
}
std::vector<float> gradient(size_t t, int step) {
  std::vector<float> g(numel(model()[t].shape));
  for (size_t e = 0; e < g.size(); ++e) {
    g[e] = 0.05f * std::sin(0.37f * static_cast<float>(e) + 0.7f * static_cast<float>(step) + static_cast<float>(t));
  }
  return g;
}

constexpr int kSteps = 3;

// The optimizers the parameters train with: AdamW for all; Muon for the matrices (group 1, whole
// or part by part) and AdamW for the rest; Adafactor for all (the matrices with the relative step).
enum class Optimizers { kAdamW, kMuon, kMuonPerPart, kAdafactor };

EngineOptions options(int stage, Optimizers which = Optimizers::kAdamW) {
  EngineOptions o;
  o.stage = stage;
  o.optimizer.kind = optim::OptimizerKind::kAdamW;
  const optim::Hyper adamw{.lr = 1e-2f, .weight_decay = 0.01f};
  o.optimizer.groups = {adamw, adamw};
  optim::Hyper& matrices = o.optimizer.groups[1];
  switch (which) {
    case Optimizers::kAdamW:
      break;
    case Optimizers::kMuon:
    case Optimizers::kMuonPerPart:
      matrices.kind = optim::OptimizerKind::kMuon;
      matrices.muon.per_part = which == Optimizers::kMuonPerPart;
      break;
    case Optimizers::kAdafactor:
      for (optim::Hyper& h : o.optimizer.groups) h.kind = optim::OptimizerKind::kAdafactor;
      matrices.adafactor.relative_step = true;
      break;
  }
  o.max_grad_norm = 0.1f;  // clips: the norm's value matters
  o.timeout = 30s;
  o.layout = {.alignment = 4, .bucket_numel = 32, .block = 8};
  return o;
}

struct Run {
  std::vector<double> norms;
  std::vector<std::vector<float>> params;  // this rank's parts, after the last step
};

// A checkpoint around the steps: `load` read after finalize() (and exported to `export_loaded`),
// the steps [first_step, last_step) taken, then `save` written with its export beside it.
struct Checkpointing {
  std::string load, export_loaded, save;
  int first_step = 0, last_step = kSteps;
};

// Trains on `comms` with this rank's parts (tp rank `r` of `tp`); partial gradients are split as
// g / tp on each tp rank (exact for tp a power of two).
Run train(const EngineComms& comms, const EngineOptions& options, int r, int tp, bool skew_replicated = false,
          const Checkpointing& ck = {}, bool forget_partial = false) {
  memory::MemoryTracker tracker;
  std::unique_ptr<memory::Device> device = memory::make_host_device(tracker, {});
  EngineComms c = comms;
  c.device = device.get();
  Engine engine(c, options);
  Run run;
  std::vector<int> ids;
  for (size_t t = 0; t < model().size(); ++t) {
    const TensorDef& d = model()[t];
    const std::vector<int64_t> ls = local_shape(d.name, d.shape, d.tp, tp);
    std::vector<float> part(numel(ls));
    const std::vector<float> full = initial(t);
    shard(full.data(), d.shape, d.tp, r, tp, part.data());
    if (skew_replicated && !d.tp.is_split() && r > 0) part.assign(part.size(), 99.0f);  // must be refused
    run.params.push_back(std::move(part));
    ids.push_back(engine.add_param({.name = d.name, .shape = ls, .dtype = DType::kFloat32,
                                    .data = {run.params.back().data(), run.params.back().size()}, .unit = d.unit,
                                    .group = d.group,
                                    // forget_partial: a partial-gradient tensor registered plainly
                                    // replicated, the mistake the first step must catch
                                    .tp = forget_partial && d.tp.partial_grad ? TpPlacement::replicated() : d.tp}));
  }
  engine.finalize();
  if (!ck.load.empty()) {
    engine.load(ck.load);
    engine.export_safetensors(ck.export_loaded);
  }
  for (int step = ck.first_step; step < ck.last_step; ++step) {
    for (int unit = 1; unit >= 0; --unit) {
      UnitScope scope = engine.gather_for_backward(unit);
      for (size_t t = 0; t < model().size(); ++t) {
        const TensorDef& d = model()[t];
        if (d.unit != unit) continue;
        const std::vector<float> full = gradient(t, step);
        std::vector<float> part(run.params[t].size());
        shard(full.data(), d.shape, d.tp, r, tp, part.data());
        if (d.tp.partial_grad) {
          if (forget_partial && tp == 2) {  // unequal parts (3:1), as sequence parallelism's tokens give
            for (float& x : part) x *= r == 0 ? 0.75f : 0.25f;
          } else {
            for (float& x : part) x /= static_cast<float>(tp);
          }
        }
        float* g = scope.grad_as<float>(ids[t]);
        for (size_t e = 0; e < part.size(); ++e) g[e] += part[e];
      }
    }
    engine.finish_backward();
    run.norms.push_back(engine.step().grad_norm);
  }
  if (!ck.save.empty()) {
    engine.save(ck.save);
    engine.export_safetensors(ck.save + ".safetensors");
  }
  for (int unit = 0; unit < 2; ++unit) {
    UnitScope scope = engine.gather(unit);
    for (size_t t = 0; t < model().size(); ++t) {
      if (model()[t].unit != unit) continue;
      const float* p = scope.param_as<float>(ids[t]);
      run.params[t].assign(p, p + run.params[t].size());
    }
  }
  return run;
}

// The whole tensors on one rank.
Run reference(const EngineOptions& options) {
  Run ref;
  testing::run_thread_ranks(1, [&](comm::Communicator& world) {
    // A tp group of one rank: every placement is the whole tensor (train() with tp = 1). Split
    // placements need tensor parallelism's finalizer, even over one rank.
    EngineComms c{.shard = &world, .finalizers = parallel::model_parallel_finalizers(world, nullptr)};
    ref = train(c, options, 0, 1);
  });
  return ref;
}

// Every step's norm within 1e-6 relative and every parameter part within 1e-6 of the whole
// tensors' run (a run that started from a checkpoint: its steps are the last ones).
void check_matches(const Run& run, const Run& ref, int r, int tp) {
  const size_t skipped = ref.norms.size() - run.norms.size();
  for (size_t s = 0; s < run.norms.size(); ++s) {
    CHECK(std::abs(run.norms[s] - ref.norms[skipped + s]) <= 1e-6 * ref.norms[skipped + s]);
  }
  double worst = 0.0;
  for (size_t t = 0; t < model().size(); ++t) {
    const TensorDef& d = model()[t];
    std::vector<float> want(run.params[t].size());
    shard(ref.params[t].data(), d.shape, d.tp, r, tp, want.data());
    for (size_t e = 0; e < want.size(); ++e) {
      worst = std::max(worst, static_cast<double>(std::abs(run.params[t][e] - want[e])));
    }
  }
  CHECK(worst <= 1e-6);
}

TEST_CASE("dp x tp trains like one rank with the whole tensors, stages 0-3") {
  for (int stage = 0; stage <= 3; ++stage) {
    const Run ref = reference(options(stage));
    for (const auto& layout : {std::pair{1, 2}, std::pair{2, 2}, std::pair{1, 4}}) {
      const int dp = layout.first, tp = layout.second;  // not a structured binding: CAPTURE takes it
      CAPTURE(stage);
      CAPTURE(dp);
      CAPTURE(tp);
      testing::run_thread_ranks(dp * tp, [&](comm::Communicator& world) {
        comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = dp, .tp = tp});
        const int r = mesh.coord().tp;
        const Run run = train(parallel::engine_comms(mesh), options(stage), r, tp);
        check_matches(run, ref, r, tp);
      });
    }
  }
}

TEST_CASE("hybrid sharding across the tp groups: dp 4 = 2 shards x 2 replicas, tp 2") {
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    const Run ref = reference(options(stage));
    testing::run_thread_ranks(8, [&](comm::Communicator& world) {
      comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = 4, .tp = 2});
      comm::HybridGroups hybrid(mesh.dp(), 2);
      const int r = mesh.coord().tp;
      const Run run = train(parallel::engine_comms(mesh, &hybrid), options(stage), r, 2);
      check_matches(run, ref, r, 2);
    });
  }
}

// Muon and Adafactor update a split tensor as the whole tensor: Muon orthogonalizes the whole matrix
// (its parts gathered over tp by tensor parallelism's finalizer), Adafactor keeps the whole
// tensor's row and column statistics and RMS (its sums completed over tp), so dp x tp trains as the
// whole tensors do on one rank, offloaded too.
TEST_CASE("Muon and Adafactor update split tensors whole: dp x tp trains like one rank, stages 0-3") {
  for (const Optimizers which : {Optimizers::kMuon, Optimizers::kAdafactor}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (const bool offload : {false, true}) {
        if (offload && stage != 2) continue;
        EngineOptions o = options(stage, which);
        o.offload.optimizer = offload;
        const Run ref = reference(o);
        for (const auto& layout : {std::pair{1, 2}, std::pair{2, 2}}) {
          const int dp = layout.first, tp = layout.second;
          CAPTURE(static_cast<int>(which));
          CAPTURE(stage);
          CAPTURE(offload);
          CAPTURE(dp);
          CAPTURE(tp);
          testing::run_thread_ranks(dp * tp, [&](comm::Communicator& world) {
            comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = dp, .tp = tp});
            const int r = mesh.coord().tp;
            check_matches(train(parallel::engine_comms(mesh), o, r, tp), ref, r, tp);
          });
        }
      }
    }
  }
}

// muon.per_part: each rank orthogonalizes its own part, scaled by its own shape. After one step
// (m = g) a part is W (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) NS(g), g its part of the clipped
// gradient; Newton-Schulz is scale-free but for its 1e-7, so the unclipped g stands in for it.
TEST_CASE("Muon per part orthogonalizes each tensor-parallel part by itself") {
  const int tp = 2;
  const Checkpointing one_step{.last_step = 1};
  Run whole;
  testing::run_thread_ranks(tp, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = 1, .tp = tp});
    const int r = mesh.coord().tp;
    const Run per_part = train(parallel::engine_comms(mesh), options(1, Optimizers::kMuonPerPart), r, tp, false, one_step);
    const Run whole_run = train(parallel::engine_comms(mesh), options(1, Optimizers::kMuon), r, tp, false, one_step);
    const EngineOptions o = options(1, Optimizers::kMuonPerPart);
    const optim::Hyper& h = o.optimizer.groups[1];
    for (size_t t = 0; t < model().size(); ++t) {
      const TensorDef& d = model()[t];
      if (d.group != 1) continue;
      CAPTURE(d.name);
      const std::vector<int64_t> ls = local_shape(d.name, d.shape, d.tp, tp);
      const size_t rows = static_cast<size_t>(ls[0]), cols = numel(ls) / rows;
      std::vector<float> w0(rows * cols), g(rows * cols), o_part(rows * cols);
      shard(initial(t).data(), d.shape, d.tp, r, tp, w0.data());
      shard(gradient(t, 0).data(), d.shape, d.tp, r, tp, g.data());
      optim::newton_schulz(g.data(), rows, cols, o_part.data());
      const double step = static_cast<double>(h.lr) * h.muon.rms_scale * std::sqrt(static_cast<double>(std::max(rows, cols)));
      double worst = 0.0, from_whole = 0.0;
      for (size_t e = 0; e < w0.size(); ++e) {
        const double want = w0[e] * (1.0 - static_cast<double>(h.lr) * h.weight_decay) - step * o_part[e];
        worst = std::max(worst, std::abs(per_part.params[t][e] - want));
        from_whole = std::max(from_whole, static_cast<double>(std::abs(per_part.params[t][e] - whole_run.params[t][e])));
      }
      CHECK(worst <= 1e-6);
      CHECK(from_whole > 1e-4);  // the whole matrix's update is another
    }
  });
}

// A (dp, tp) layout at a stage, hybrid sharding (2 shards per replica) or not.
struct Layout {
  int dp, tp, stage;
  bool hybrid = false;
  Optimizers optimizers = Optimizers::kAdamW;
};

// Runs train() on `l`'s ranks as threads.
void train_at(const Layout& l, const Checkpointing& ck, const std::function<void(const Run&, int)>& check) {
  testing::run_thread_ranks(l.dp * l.tp, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = l.dp, .tp = l.tp});
    std::unique_ptr<comm::HybridGroups> hybrid;
    if (l.hybrid) hybrid = std::make_unique<comm::HybridGroups>(mesh.dp(), 2);
    const Run run =
        train(parallel::engine_comms(mesh, hybrid.get()), options(l.stage, l.optimizers), mesh.coord().tp, l.tp, false, ck);
    check(run, mesh.coord().tp);
  });
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_CASE("a checkpoint moves between (dp, tp) layouts and stages, and the run goes on as the whole tensors' run") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/engine_tp_ckpt";
  struct Move {
    Layout from, to;
  };
  const Optimizers muon = Optimizers::kMuon, adafactor = Optimizers::kAdafactor;
  for (const Move& m : {Move{{1, 2, 3}, {2, 1, 1}}, Move{{2, 2, 2}, {1, 4, 3}}, Move{{1, 1, 0}, {2, 2, 2}},
                        Move{{4, 2, 3, true}, {1, 2, 0}}, Move{{1, 4, 1}, {4, 2, 2, true}},
                        Move{{2, 2, 2, false, muon}, {1, 4, 3, false, muon}},
                        Move{{2, 2, 2, false, adafactor}, {1, 4, 3, false, adafactor}},
                        Move{{1, 2, 3, false, adafactor}, {2, 1, 1, false, adafactor}}}) {
    CAPTURE(m.from.dp);
    CAPTURE(m.from.tp);
    CAPTURE(m.from.stage);
    CAPTURE(m.to.dp);
    CAPTURE(m.to.tp);
    CAPTURE(m.to.stage);
    CAPTURE(static_cast<int>(m.to.optimizers));
    const Run ref = reference(options(m.to.stage, m.to.optimizers));
    std::filesystem::remove_all(dir);
    // Two steps at one layout, saved; loaded at the other (its export then the same bytes as the
    // saved run's), and the third step taken there.
    train_at(m.from, {.save = dir, .first_step = 0, .last_step = kSteps - 1}, [](const Run&, int) {});
    train_at(m.to, {.load = dir, .export_loaded = dir + "_loaded.safetensors", .first_step = kSteps - 1},
             [&](const Run& run, int r) { check_matches(run, ref, r, m.to.tp); });
    CHECK(slurp(dir + "_loaded.safetensors") == slurp(dir + ".safetensors"));
  }
}

TEST_CASE("ranks that disagree on a placement fail at finalize, naming the parameter") {
  testing::run_thread_ranks(2, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = 1, .tp = 2});
    memory::MemoryTracker tracker;
    std::unique_ptr<memory::Device> device = memory::make_host_device(tracker, {});
    Engine engine(parallel::engine_comms(mesh, nullptr, device.get()), options(2));
    std::vector<float> w(4, 1.0f);
    // tp rank 1 says replicated where rank 0 says split(0): the same part shape, another meaning.
    const TpPlacement p = mesh.coord().tp == 0 ? TpPlacement::split(0) : TpPlacement::replicated();
    engine.add_param({.name = "fc.b", .shape = {4}, .dtype = DType::kFloat32, .data = {w.data(), w.size()}, .tp = p});
    try {
      engine.finalize();
      FAIL("finalize accepted the disagreement");
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      CAPTURE(m);
      CHECK(m.find("'fc.b'") != std::string::npos);
      CHECK(m.find("split(0)") != std::string::npos);
    }
  });
}

TEST_CASE("replicated parameters whose values differ across tp are refused at finalize, naming the first") {
  testing::run_thread_ranks(4, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = 2, .tp = 2});
    CHECK_THROWS_WITH_AS(train(parallel::engine_comms(mesh), options(1), mesh.coord().tp, 2, /*skew_replicated=*/true),
                         doctest::Contains("differs across ranks (ranks differing from rank 0: 1): parameter 'fc.norm': "
                                           "rank 0 holds values of digest"),
                         InvalidArgument);
  });
}

TEST_CASE("a partial gradient registered replicated is refused at the first step on every rank, naming it where held") {
  // dp 2 x tp 2 at stage 2: the norm's pieces are owned by one data-parallel coordinate, so the other
  // learns of it through the agreement; at stage 0 every rank holds them.
  for (int stage : {0, 2}) {
    CAPTURE(stage);
    std::atomic<int> named{0}, told{0};
    testing::run_thread_ranks(4, [&](comm::Communicator& world) {
      comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = 2, .tp = 2});
      try {
        train(parallel::engine_comms(mesh), options(stage), mesh.coord().tp, 2, false, {}, /*forget_partial=*/true);
        FAIL("trained with a partial gradient registered replicated");
      } catch (const InvalidArgument& e) {
        const std::string m = e.what();
        if (m.find("is held whole on every rank of its tensor-parallel group, but its gradient differs across them at "
                   "the first step") != std::string::npos) {
          CHECK((m.find("parameter 'fc.norm'") != std::string::npos || m.find("parameter 'ln.") != std::string::npos));
          CHECK(m.find("TpPlacement::replicated_partial()") != std::string::npos);
          ++named;
        } else {
          CHECK(m.find("the error on the ranks that hold it names it") != std::string::npos);
          ++told;
        }
      }
    });
    CHECK(named + told == 4);
    CHECK(named >= 2);  // at least one tp pair holds a piece
    if (stage == 0) CHECK(named == 4);
  }
}

TEST_CASE("split placements without tensor parallelism's finalizer are refused at finalize, naming the parameter") {
  testing::run_thread_ranks(1, [&](comm::Communicator& world) {
    CHECK_THROWS_WITH_AS(train(EngineComms{.shard = &world}, options(1), 0, 1),
                         doctest::Contains("parameter 'fc.w' is split over tensor parallelism (ParamSpec.tp = split(0)) "
                                           "but no gradient finalizer of the engine takes it (EngineComms.finalizers)"),
                         InvalidArgument);
  });
}

TEST_CASE("a placement the part cannot have is refused naming the parameter") {
  testing::run_thread_ranks(1, [&](comm::Communicator& world) {
    Engine engine(world, options(1));
    std::vector<float> w(10, 1.0f);
    engine.add_param({.name = "attn.qkv", .shape = {10}, .dtype = DType::kFloat32, .data = {w.data(), w.size()},
                      .tp = TpPlacement::split(0, 3)});
    CHECK_THROWS_WITH_AS(engine.finalize(),
                         doctest::Contains("parameter 'attn.qkv': placement split(0, 3 blocks) but its part's "
                                           "dimension 0 has size 10"),
                         InvalidArgument);
  });
}

}  // namespace
}  // namespace zero
