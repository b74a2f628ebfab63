// The wirings that used to train silently wrong, and the bad input that used to be named the wrong
// way, each made on purpose with the residual MLP (tests/residual_mlp.h): every rank gets the same
// error naming the culprit, before anything trains, and none is left waiting.
#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/hybrid_groups.h"
#include "comm/mesh.h"
#include "memory/device.h"
#include "optim/custom_optimizer.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/pipeline_stage.h"
#include "parallel/pipeline/schedules.h"
#include "testing/thread_ranks.h"
#include "tests/residual_mlp.h"
#include "zero/engine.h"

namespace zero::testing {
namespace {

using parallel::StageCall;
using parallel::StageTensor;

constexpr MlpShape kShape{.dim = 4, .hidden = 8, .layers = 4};

EngineOptions options() {
  EngineOptions o;
  o.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
  o.timeout = std::chrono::seconds(30);
  return o;
}

// The chunks of a pipeline stage and their functions; `whole_backward`: the backward ignores the
// part the schedule asks for and runs whole.
struct Chunks {
  std::vector<std::unique_ptr<ResidualMlp>> chunks;
  Chunks(parallel::PipelineStage& pipe, comm::Communicator& tp, Engine& engine) {
    for (int c = 0; c < pipe.chunks(); ++c) chunks.push_back(std::make_unique<ResidualMlp>(kShape, tp, engine, pipe.layers(c)));
  }
  parallel::StageModel model(bool whole_backward = false) {
    auto at = [this](const StageCall& c) -> ResidualMlp& { return *chunks[static_cast<size_t>(c.chunk)]; };
    return {.forward = [at](const StageCall& c, const StageTensor& in, StageTensor& out) { return at(c).forward(c, in, out, 0); },
            .backward =
                [at, whole_backward](const StageCall& c, const StageTensor& dy, StageTensor& dx) {
                  StageCall call = c;
                  if (whole_backward) call.part = BackwardPart::kAll;
                  at(c).backward(call, dy, dx);
                },
            .weight = [at](const StageCall& c) { at(c).weight(c); },
            .activation = [](int, int samples) { return parallel::TensorSpec{static_cast<size_t>(samples * kShape.dim)}; }};
  }
};

TEST_CASE("a pipeline whose engine has no norm group is refused: each stage would clip by its own norm") {
  run_thread_ranks(2, [](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 2});
    Engine engine(EngineComms{.shard = &mesh.dp()}, options());
    CHECK_THROWS_WITH_AS(parallel::PipelineStage(mesh, engine, parallel::one_f_one_b(2, 4), {.layers = 4}),
                         "PipelineStage: the engine adds the gradient norm over 1 rank(s) (EngineComms.model_parallel is "
                         "null) but the model is split over tp x pp = 2: each stage would clip by its own norm; build the "
                         "engine's groups from the mesh (parallel::engine_comms)",
                         InvalidArgument);
  });
}

TEST_CASE("a tensor-parallel layout whose engine has no tensor-parallel finalizer is refused by the pipeline stage") {
  run_thread_ranks(2, [](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.tp = 2});
    Engine engine(EngineComms{.shard = &mesh.dp(), .model_parallel = &mesh.model_parallel()}, options());
    CHECK_THROWS_WITH_AS(parallel::PipelineStage(mesh, engine, parallel::one_f_one_b(1, 2), {.layers = 4}),
                         doctest::Contains("no gradient finalizer of the engine (EngineComms.finalizers) works over the "
                                           "mesh's tensor-parallel group of 2 ranks"),
                         InvalidArgument);
  });
}

TEST_CASE("split placements without tensor parallelism's finalizer are refused at finalize, naming the parameter") {
  run_thread_ranks(2, [](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.tp = 2});
    Engine engine(EngineComms{.shard = &mesh.dp()}, options());
    ResidualMlp model(kShape, mesh.tp(), engine, {0, 1});
    CHECK_THROWS_WITH_AS(engine.finalize(),
                         doctest::Contains("parameter 'block0.w1' is split over tensor parallelism (ParamSpec.tp = "
                                           "split(0)) but no gradient finalizer of the engine takes it "
                                           "(EngineComms.finalizers): build the engine's groups from the mesh "
                                           "(parallel::engine_comms)"),
                         InvalidArgument);
  });
}

// A per-tensor rule (LAMB's trust ratio is one): what it computes from a tensor must see all of it.
class WholeTensorRule : public optim::CustomOptimizer {
 public:
  std::string name() const override { return "whole-tensor"; }
  std::vector<std::string> state_names() const override { return {}; }
  bool needs_whole_tensors() const override { return true; }
  void update(const optim::UpdateContext&, const optim::OwnedRange& r) override {
    for (size_t i = 0; i < r.numel; ++i) r.master[i] -= 0.1f * r.grad[i];
  }
};

// Tensor parallelism's finalizer with its update-time gather taken away: a finalizer that splits
// tensors but cannot hand them whole (as on a device whose tp group takes no host memory).
class SplitsWithoutGather : public GradFinalizer {
 public:
  explicit SplitsWithoutGather(GradFinalizers inner) : inner_(std::move(inner.front())) {}
  std::string name() const override { return inner_->name(); }
  comm::Communicator* group() const override { return inner_->group(); }
  comm::Communicator* splits_over() const override { return inner_->splits_over(); }
  bool same_registration() const override { return inner_->same_registration(); }
  void bind(memory::Device& d, std::chrono::milliseconds t) override { inner_->bind(d, t); }
  void check(ParamRegistry& r) override { inner_->check(r); }
  void initial_values(const ParamRegistry& r) override { inner_->initial_values(r); }
  bool claims(const ParamSpec& p) const override { return inner_->claims(p); }
  bool copies(const ParamSpec& p) const override { return inner_->copies(p); }
  bool holds(const ParamSpec& p) const override { return inner_->holds(p); }
  bool sums_reduced(const ParamSpec& p) const override { return inner_->sums_reduced(p); }
  void complete_held(const ParamSpec& p, void* g, DType d) override { inner_->complete_held(p, g, d); }

 private:
  std::shared_ptr<GradFinalizer> inner_;
};

TEST_CASE("a rule that needs whole tensors is refused where a finalizer splits one it cannot gather, naming it") {
  run_thread_ranks(2, [](comm::Communicator& world) {
    EngineOptions o = options();
    o.optimizer.custom = std::make_shared<WholeTensorRule>();
    o.layout.whole_tensors = true;
    comm::Mesh mesh(world, comm::MeshShape{.tp = 2});
    EngineComms comms = parallel::engine_comms(mesh);
    comms.finalizers = {std::make_shared<SplitsWithoutGather>(parallel::model_parallel_finalizers(mesh.tp(), nullptr))};
    Engine engine(comms, o);
    ResidualMlp model(kShape, mesh.tp(), engine, {0, 1});
    CHECK_THROWS_WITH_AS(engine.finalize(),
                         doctest::Contains("optimizer 'whole-tensor' needs whole tensors but parameter 'block0.w1' is "
                                           "split across the 2 ranks of the tensor-parallel finalizer"),
                         InvalidArgument);
  });
}

TEST_CASE("a finalizer over more ranks than the norm group, or serving a second engine, is refused") {
  run_thread_ranks(2, [](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.tp = 2});
    CHECK_THROWS_WITH_AS(
        Engine(EngineComms{.shard = &mesh.dp(), .finalizers = parallel::model_parallel_finalizers(mesh.tp(), nullptr)},
               options()),
        "the tensor-parallel gradient finalizer works over 2 ranks but the norm group (EngineComms.model_parallel) is "
        "null: each rank would clip by the norm of its own part; build the engine's groups from the mesh "
        "(parallel::engine_comms)",
        InvalidArgument);
    const EngineComms comms = parallel::engine_comms(mesh);
    Engine first(comms, options());
    CHECK_THROWS_WITH_AS(Engine(comms, options()), doctest::Contains("serves one engine; it is bound already"),
                         InvalidArgument);
  });
}

TEST_CASE("options that disagree with the mesh's layout, or hybrid groups twice, are refused naming both") {
  run_thread_ranks(4, [](comm::Communicator& world) {
    const Layout layout = parse_layout("dp=0,tp=2,stage=3,shard=1");
    comm::Mesh mesh(world, layout);
    EngineOptions o = options();
    o.stage = 2;
    CHECK_THROWS_WITH_AS(Engine(parallel::engine_comms(mesh), o),
                         "EngineOptions.stage is 2 but the mesh's layout has stage=3 (build the options with "
                         "engine_options(layout, base), or the mesh from the layout the run uses)",
                         InvalidArgument);
    o.stage = 3;
    o.offload.optimizer = true;
    CHECK_THROWS_WITH_AS(Engine(parallel::engine_comms(mesh), o),
                         doctest::Contains("EngineOptions.offload.optimizer is true but the mesh's layout has offload_optimizer=false"),
                         InvalidArgument);
    // The mesh splits its own hybrid groups from the layout's shard; a second set is refused.
    REQUIRE(mesh.hybrid() != nullptr);
    const comm::HybridGroups extra(mesh.dp(), 1);
    CHECK_THROWS_WITH_AS(parallel::engine_comms(mesh, &extra),
                         "engine_comms: hybrid groups given (2 shard groups of 1 rank) beside the mesh's own (its layout's "
                         "shard=1)",
                         InvalidArgument);
    // Built from the layout, both agree, and the engine's groups are the mesh's hybrid ones.
    const EngineComms comms = parallel::engine_comms(mesh);
    CHECK(comms.shard == mesh.hybrid()->shard());
    CHECK(comms.replica == mesh.hybrid()->replica());
    Engine engine(comms, engine_options(*mesh.layout(), options()));
    CHECK(engine.options().stage == 3);
  });
}

TEST_CASE("a tensor split across tp but registered replicated is refused at finalize, naming it and the tp ranks") {
  run_thread_ranks(4, [](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.dp = 2, .tp = 2});
    Engine engine(parallel::engine_comms(mesh), options());
    // Each tp rank's half of a [4, 2] matrix, registered without its split placement; the other
    // tensor really is replicated.
    std::vector<float> part(4), norm(2, 1.0f);
    for (size_t e = 0; e < part.size(); ++e) part[e] = static_cast<float>(mesh.coord().tp * 4 + static_cast<int>(e));
    engine.add_param({.name = "norm.weight", .shape = {2}, .data = {norm.data(), 2}});
    engine.add_param({.name = "fc.weight", .shape = {2, 2}, .data = {part.data(), 4}});
    CHECK_THROWS_WITH_AS(engine.finalize(),
                         doctest::Contains("differs across ranks (ranks differing from rank 0: 1): parameter 'fc.weight': "
                                           "rank 0 holds values of digest"),
                         InvalidArgument);
  });
}

// Two pipeline ranks under zb-h1 with the residual MLP's chunks registered, not yet finalized.
void on_zb_h1_pipeline(const std::function<void(parallel::PipelineStage&, Chunks&)>& body) {
  run_thread_ranks(2, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 2});
    Engine engine(parallel::engine_comms(mesh), options());
    parallel::PipelineStage pipe(mesh, engine, parallel::zb_h1(2, 4), {.layers = 4});
    Chunks chunks(pipe, mesh.tp(), engine);
    body(pipe, chunks);
  });
}

TEST_CASE("a whole backward where the schedule asks for its input part is named at the weight pass") {
  on_zb_h1_pipeline([](parallel::PipelineStage& pipe, Chunks& chunks) {
    pipe.finalize(chunks.model(/*whole_backward=*/true));
    CHECK_THROWS_WITH_AS(pipe.train_step(8, 1.0f),
                         doctest::Contains("has no input-gradient scope (BackwardPart::kInput) before this weight-gradient "
                                           "scope in this micro-step"),
                         Error);
  });
}

TEST_CASE("a missing stage function is named") {
  on_zb_h1_pipeline([](parallel::PipelineStage& pipe, Chunks& chunks) {
    parallel::StageModel model = chunks.model();
    model.weight = nullptr;
    CHECK_THROWS_WITH_AS(pipe.finalize(model),
                         "PipelineStage::finalize(): the schedule 'zb-h1' splits the backward into B and W but no weight "
                         "function was given (StageModel::weight)",
                         InvalidArgument);
    model = chunks.model();
    model.activation = nullptr;
    CHECK_THROWS_WITH_AS(pipe.finalize(model), "PipelineStage::finalize(): no StageModel::activation was given",
                         InvalidArgument);
  });
}

TEST_CASE("stages left without a layer are named by virtual stage and world rank on every rank") {
  run_thread_ranks(6, [](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 6});
    Engine engine(parallel::engine_comms(mesh), options());
    parallel::PipelineStage pipe(mesh, engine, parallel::one_f_one_b(6, 6), {.layers = 4});
    Chunks chunks(pipe, mesh.tp(), engine);
    CHECK_THROWS_WITH_AS(pipe.finalize(chunks.model()),
                         "PipelineStage: stages registered no trainable parameters: virtual stage 4 (pipeline rank 4, "
                         "world rank 4: layers [4, 4)); virtual stage 5 (pipeline rank 5, world rank 5: layers [4, 4)); 6 "
                         "virtual stages over 4 layers (pp x chunks, or PipelineOptions.layer_counts, leaves a stage "
                         "without a layer)",
                         InvalidArgument);
  });
}

TEST_CASE("a batch the micro-batches do not divide, and a cut that does not fit, are named") {
  run_thread_ranks(2, [](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.dp = 2});
    Engine engine(parallel::engine_comms(mesh), options());
    CHECK_THROWS_WITH_AS(parallel::PipelineStage(mesh, engine, parallel::one_f_one_b(1, 4), {.layers = 4, .layer_counts = {3}}),
                         "PipelineOptions.layer_counts sums to 3 layers but PipelineOptions.layers is 4", InvalidArgument);
    parallel::PipelineStage pipe(mesh, engine, parallel::one_f_one_b(1, 8), {.layers = 4});
    CHECK_THROWS_WITH_AS(pipe.data_parallel_slice(7),
                         "PipelineStage: a global batch of 7 samples does not divide among 2 data-parallel ranks",
                         InvalidArgument);
    Chunks chunks(pipe, mesh.tp(), engine);
    pipe.finalize(chunks.model());
    CHECK(engine.options().micro_batches == 8);  // the schedule's m
    CHECK_THROWS_WITH_AS(pipe.train_step(12, 1.0f),
                         "PipelineStage::train_step: this data-parallel rank's batch of 12 samples does not divide into 8 "
                         "micro-batches",
                         InvalidArgument);
  });
}

TEST_CASE("a schedule, an engine or a call that does not fit the mesh is named before anything runs") {
  run_thread_ranks(4, [](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 2, .dp = 2});
    {  // a schedule for another pipeline size
      Engine engine(parallel::engine_comms(mesh), options());
      CHECK_THROWS_WITH_AS(parallel::PipelineStage(mesh, engine, parallel::one_f_one_b(4, 4), {.layers = 4}),
                           "PipelineStage: the schedule '1f1b' has 4 pipeline ranks but the mesh's pp is 2",
                           InvalidArgument);
      CHECK_THROWS_WITH_AS(parallel::PipelineStage(mesh, engine, parallel::one_f_one_b(2, 4), {.layers = 0}),
                           "PipelineOptions.layers is 0: a pipelined model has layers to cut", InvalidArgument);
    }
    {  // an engine over the whole world, not the mesh's data-parallel group
      Engine engine(world, options());
      CHECK_THROWS_WITH_AS(parallel::PipelineStage(mesh, engine, parallel::one_f_one_b(2, 4), {.layers = 4}),
                           doctest::Contains("the engine's data-parallel group has 4 ranks but the mesh's dp is 2"),
                           InvalidArgument);
    }
    {  // hybrid groups built over the world instead of the mesh's dp group
      comm::HybridGroups hybrid(world, 2);
      CHECK_THROWS_WITH_AS(parallel::engine_comms(mesh, &hybrid),
                           "engine_comms: the hybrid groups (2 shard groups of 2 ranks) are not over the "
                           "mesh's 2 data-parallel ranks",
                           InvalidArgument);
    }
    {  // a stage built on a finalized engine; a step before the stage's finalize
      Engine engine(parallel::engine_comms(mesh), options());
      parallel::PipelineStage pipe(mesh, engine, parallel::one_f_one_b(2, 4), {.layers = 4});
      CHECK_THROWS_WITH_AS(pipe.train_step(8, 1.0f), "PipelineStage::train_step() before finalize()", InvalidArgument);
      Chunks chunks(pipe, mesh.tp(), engine);
      pipe.finalize(chunks.model());
      CHECK_THROWS_WITH_AS(pipe.finalize(chunks.model()), "PipelineStage::finalize() called twice", InvalidArgument);
      CHECK_THROWS_WITH_AS(parallel::PipelineStage(mesh, engine, parallel::one_f_one_b(2, 4), {.layers = 4}),
                           "PipelineStage: the engine is finalized; build the stage first", InvalidArgument);
    }
  });
}

TEST_CASE("a stage tensor read as another type is named") {
  memory::MemoryTracker tracker;
  const std::unique_ptr<memory::Device> device = memory::make_host_device(tracker);
  parallel::StageTensor t = parallel::StageTensor::allocate(*device, {.numel = 6, .dtype = DType::kFloat32});
  CHECK(t.span<float>().size() == 6);
  CHECK_THROWS_WITH_AS(t.span<double>(), "a fp64 view of a stage tensor of 6 elements of fp32", InvalidArgument);
}

}  // namespace
}  // namespace zero::testing
