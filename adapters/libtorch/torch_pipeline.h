#pragma once
// Pipeline stages of torch::nn modules (docs/libtorch.md): the library's PipelineStage runs this
// rank's chunks of a LibTorch model under any schedule, with the engine's ZeRO stage.
//
//   comm::Mesh mesh(world, comm::MeshShape{.pp = 2, .dp = 2});
//   zero::Engine engine(parallel::engine_comms(mesh), options);
//   parallel::PipelineStage pipe(mesh, engine, parallel::make_schedule("1f1b", 2, 8), {.layers = 8});
//   libtorch::TorchPipeline tp(engine, pipe, [&](int layer) { return Block(...); }, functions);
//   tp.finalize();                                         // pipe.finalize(): collective
//   for (...) { pipe.train_step(samples, engine.loss_scale()); engine.step(); }
//
// The model is a stack of layers (a torch::nn module each, built here by the caller's function for
// the layers of this rank's chunks); each layer is one engine unit (its global layer index), its
// parameters registered as "<layer>.<name>" with their tensor-parallel placements (a
// TensorParallelModule's own; others replicated). The first virtual stage's input comes from
// `input` (this micro-batch's samples), the last one's loss from `loss` (the micro-batch's mean).
//
// Autograd runs layer by layer. The forward keeps each layer's output in the (micro-batch, chunk)'s
// context (StageCall::context), so the graph of every micro-batch in flight lives until its
// backward, whatever the schedule interleaves. The backward walks the layers in reverse, each in its
// own backward scope: torch::autograd::grad from the layer's output to its input and its parameters,
// the parameter gradients added into the engine's (UnitScope::grad), the input's gradient handed on.
// Under a schedule that splits the backward (zb-h1) the input part asks for the input's gradient
// only, keeping the layer's graph (retain_graph), and keeps the gradient of each layer's output; the
// weight part asks for the parameters' gradients from there, walking each layer's graph a second
// time (the price of the split here: a hand-written model computes each weight gradient once). At
// stage 3 each scope points the layer's parameter storage at its gathered copy, as TorchEngine
// does; the weight part's scope gathers nothing (BackwardPart::kWeight) while the second walk may
// read the parameters, so it opens an input-part scope beside it to gather them (one more gather
// of each layer per micro-batch than a hand-written model's split).
//
// With `recompute` a micro-batch in flight holds only its layers' inputs (one activation per
// layer), not their graphs; each layer's forward runs twice.
//
// Tied weights (`tied`: an input embedding and the output head that reuses it): the last virtual
// stage's copy is the first's. Where two ranks hold them, each registers its copy under the first's
// name as a tied parameter (ParamSpec::tied): the engine starts the last's from the first's values
// and sums the two gradients over the mesh's tied group (parallel::engine_comms(mesh)). Where one
// rank holds both (one stage, or a V's rank 0), the copy is registered once, the last's tensor reads
// the first's (its storage, or at stage 3 the first layer's gathered copy), and its gradient,
// collected over the step's micro-batches, is added into the first's as that layer's last backward of
// the step closes: E + H, the sum two ranks make, so every layout gives the same bits.
//
// Caveats: activations are float32 (the shape `activation_shape` gives); a layer reads its input
// only through the tensor it is given.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/modules/container/any.h>
#include <torch/types.h>

#include "parallel/pipeline/pipeline_stage.h"
#include "zero/engine.h"

namespace zero::libtorch {

// A weight the last virtual stage reuses from the first: parameter names "<layer>.<name>".
struct TiedWeight {
  std::string first;  // in layer 0: the copy registered (and checkpointed, and listed) by this name
  std::string last;   // in the last layer, of the same shape (its own initial values are not used)
};

struct TorchStageFunctions {
  // The first virtual stage's input for the call's micro-batch (no gradient is taken of it).
  std::function<torch::Tensor(const parallel::StageCall& call)> input;
  // The last virtual stage's loss: the micro-batch's mean, a 0-dimensional tensor.
  std::function<torch::Tensor(const parallel::StageCall& call, const torch::Tensor& output)> loss;
  // The shape of the activation leaving virtual stage k for a micro-batch of `samples` samples.
  std::function<std::vector<int64_t>(int virtual_stage, int samples)> activation_shape;
  // Activation recompute (LibTorch's C++ API has no torch.utils.checkpoint): the forward runs
  // without autograd and keeps only each layer's input; the backward runs each layer's forward
  // again under autograd, inside the layer's backward scope, before taking its gradients.
  bool recompute = false;
  // Weights the last layer shares with layer 0 (above). Each name must be a parameter of its layer
  // (InvalidArgument naming it on the rank that holds the layer, or the shapes that differ).
  std::vector<TiedWeight> tied;
};

class TorchPipeline {
 public:
  // Builds the layers of this rank's chunks with `layer(l)` and registers their parameters with
  // `engine` (before finalize). Throws InvalidArgument naming a missing function, a layer module
  // without parameters' own storage (as TorchEngine), or a tied weight (above) that does not fit.
  TorchPipeline(Engine& engine, parallel::PipelineStage& pipe, const std::function<torch::nn::AnyModule(int layer)>& layer,
                TorchStageFunctions functions);
  ~TorchPipeline();
  TorchPipeline(const TorchPipeline&) = delete;
  TorchPipeline& operator=(const TorchPipeline&) = delete;

  // Collective: pipe.finalize() with this adapter's stage functions; at stage 3 the layers'
  // parameter storage is released (it points at gathered copies inside scopes only).
  void finalize();

  // Layer l's module (one of this rank's chunks); InvalidArgument naming l otherwise.
  torch::nn::AnyModule& layer(int l);
  // Collective over the pipeline stage's engine: every parameter of this rank's layers, as
  // "<layer>.<name>" and its current values (cloned; at stage 3 gathered layer by layer).
  std::vector<std::pair<std::string, torch::Tensor>> parameters();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::libtorch
