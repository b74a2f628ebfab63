#include "adapters/libtorch/torch_pipeline.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/container/any.h>
#include <torch/utils.h>

#include <any>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "adapters/libtorch/module_params.h"
#include "base/check.h"
#include "base/error.h"

namespace zero::libtorch {
namespace {

using parallel::StageCall;
using parallel::StageTensor;

struct Param {
  std::string name;  // "<layer>.<name in the layer>"
  torch::Tensor tensor;
  int id = -1;
  bool trainable = true;
};

struct Layer {
  torch::nn::AnyModule module;
  std::vector<Param> params;
};

// What a (micro-batch, chunk)'s backward needs from its forward: the chunk's input (a leaf that
// takes a gradient, except on the first virtual stage), each layer's output (the last stage's last
// "output" is the loss), and, between a split backward's two parts, the gradient of each output.
struct Saved {
  torch::Tensor input;
  std::vector<torch::Tensor> outputs;
  std::vector<torch::Tensor> output_grads;
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

struct TorchPipeline::Impl {
  Engine& engine;
  parallel::PipelineStage& pipe;
  TorchStageFunctions fns;
  std::map<int, Layer> layers;  // this rank's, by global index
  bool sharded = false;         // stage 3: parameter storage points at gathered copies in scopes only
  bool finalized = false;

  Impl(Engine& e, parallel::PipelineStage& p, TorchStageFunctions f) : engine(e), pipe(p), fns(std::move(f)) {}

  Layer& layer(int l) {
    const auto it = layers.find(l);
    if (it == layers.end()) ZERO_THROW(InvalidArgument, "TorchPipeline: layer {} is not in this rank's chunks", l);
    return it->second;
  }

  // The layer's trainable parameters' storage at `scope`'s copies (stage 3), or at nothing.
  void point(Layer& layer, UnitScope* scope) {
    if (!sharded) return;
    for (Param& p : layer.params) {
      if (p.trainable) point_storage(p.tensor, scope != nullptr ? scope->param(p.id) : nullptr);
    }
  }

  // Adds the parameters' gradients (undefined: the layer did not use it) into the engine's.
  static void accumulate(UnitScope& scope, const std::vector<Param*>& params, const std::vector<torch::Tensor>& grads,
                         size_t first) {
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& g = grads[first + i];
      if (g.defined()) view_of(scope.grad(params[i]->id), params[i]->tensor).add_(g);
    }
  }

  static std::vector<Param*> trainable(Layer& layer) {
    std::vector<Param*> out;
    for (Param& p : layer.params) {
      if (p.trainable) out.push_back(&p);
    }
    return out;
  }

  torch::Tensor activation(int virtual_stage, int samples, const StageTensor& t) const {
    const std::vector<int64_t> shape = fns.activation_shape(virtual_stage, samples);
    ZERO_CHECK(static_cast<size_t>(numel_of(shape)) == t.numel(), "TorchPipeline: activation of virtual stage {}: {} "
               "elements for a shape of {}", virtual_stage, t.numel(), numel_of(shape));
    return torch::from_blob(const_cast<void*>(t.data()), shape, torch::kFloat).clone();
  }

  static void fill(StageTensor& out, const torch::Tensor& value, int virtual_stage, const char* what) {
    const torch::Tensor v = value.detach().to(torch::kFloat).contiguous();
    if (static_cast<size_t>(v.numel()) != out.numel()) {
      ZERO_THROW(InvalidArgument,
                 "TorchPipeline: the {} of virtual stage {} has {} elements; TorchStageFunctions.activation_shape "
                 "says {}",
                 what, virtual_stage, v.numel(), out.numel());
    }
    std::memcpy(out.data(), v.data_ptr<float>(), out.numel() * sizeof(float));
  }

  float forward(const StageCall& call, const StageTensor& in, StageTensor& out) {
    auto saved = std::make_shared<Saved>();
    std::optional<torch::NoGradGuard> no_grad;
    if (!call.training || fns.recompute) no_grad.emplace();
    saved->input = call.first ? fns.input(call)
                              : activation(call.virtual_stage - 1, call.samples(), in).requires_grad_(call.training);
    torch::Tensor h = saved->input;
    for (int l = call.layers.first; l < call.layers.end; ++l) {
      Layer& L = layer(l);
      UnitScope scope = engine.gather(l);
      point(L, &scope);
      h = L.module.forward(h);
      point(L, nullptr);
      saved->outputs.push_back(h);
    }
    float loss = 0.0f;
    if (call.last) {
      const torch::Tensor value = fns.loss(call, h);
      loss = value.item<float>();
      saved->outputs.back() = value;  // the backward starts from the loss
    } else {
      fill(out, h, call.virtual_stage, "output");
    }
    if (call.training) call.context = std::move(saved);
    return loss;
  }

  // kAll or kInput: layer by layer in reverse, the input's gradient handed on (and, for kInput, the
  // gradient of each layer's output kept for the weight part).
  void backward(const StageCall& call, const StageTensor& grad_output, StageTensor& grad_input) {
    Saved& s = *std::any_cast<std::shared_ptr<Saved>&>(call.context);
    const bool split = call.part == BackwardPart::kInput;
    const size_t n = s.outputs.size();
    torch::Tensor g = call.last ? torch::full({}, call.loss_scale, torch::kFloat)
                                : activation(call.virtual_stage, call.samples(), grad_output);
    if (split) s.output_grads.assign(n, torch::Tensor());
    for (size_t i = n; i-- > 0;) {
      Layer& L = layer(call.layers.first + static_cast<int>(i));
      UnitScope scope = engine.gather_for_backward(call.layers.first + static_cast<int>(i), call.part);
      point(L, &scope);
      const bool wants_input = !(i == 0 && call.first);
      torch::Tensor x = i == 0 ? s.input : s.outputs[i - 1];
      if (fns.recompute) {  // the layer's forward again, under autograd, from its kept input
        x = x.detach().requires_grad_(wants_input);
        torch::Tensor y = L.module.forward(x);
        s.outputs[i] = call.last && i + 1 == n ? fns.loss(call, y) : y;
      }
      std::vector<torch::Tensor> inputs;
      if (wants_input) inputs.push_back(x);
      const std::vector<Param*> params = split ? std::vector<Param*>{} : trainable(L);
      for (Param* p : params) inputs.push_back(p->tensor);
      if (split) s.output_grads[i] = g;
      torch::Tensor next;
      if (!inputs.empty()) {
        const std::vector<torch::Tensor> grads = torch::autograd::grad({s.outputs[i]}, inputs, {g}, /*retain_graph=*/split,
                                                                       /*create_graph=*/false, /*allow_unused=*/true);
        accumulate(scope, params, grads, wants_input ? 1 : 0);
        if (wants_input) next = grads[0];
      }
      point(L, nullptr);
      g = next;
    }
    if (!call.first) {
      ZERO_CHECK(g.defined(), "TorchPipeline: virtual stage {}'s input took no gradient", call.virtual_stage);
      fill(grad_input, g, call.virtual_stage, "input gradient");
    }
  }

  // kWeight after kInput: each layer's parameters' gradients from its output's kept gradient,
  // walking the layer's retained graph again.
  void weight(const StageCall& call) {
    Saved& s = *std::any_cast<std::shared_ptr<Saved>&>(call.context);
    for (size_t i = s.outputs.size(); i-- > 0;) {
      Layer& L = layer(call.layers.first + static_cast<int>(i));
      UnitScope scope = engine.gather_for_backward(call.layers.first + static_cast<int>(i), BackwardPart::kWeight);
      const std::vector<Param*> params = trainable(L);
      if (params.empty()) continue;
      std::vector<torch::Tensor> inputs;
      for (Param* p : params) inputs.push_back(p->tensor);
      const std::vector<torch::Tensor> grads = torch::autograd::grad({s.outputs[i]}, inputs, {s.output_grads[i]},
                                                                     /*retain_graph=*/false, /*create_graph=*/false,
                                                                     /*allow_unused=*/true);
      accumulate(scope, params, grads, 0);
    }
  }
};

TorchPipeline::TorchPipeline(Engine& engine, parallel::PipelineStage& pipe,
                             const std::function<torch::nn::AnyModule(int layer)>& layer, TorchStageFunctions functions)
    : impl_(std::make_unique<Impl>(engine, pipe, std::move(functions))) {
  const TorchStageFunctions& f = impl_->fns;
  for (const auto& [given, name] : {std::pair{static_cast<bool>(f.input), "input"}, std::pair{static_cast<bool>(f.loss), "loss"},
                                    std::pair{static_cast<bool>(f.activation_shape), "activation_shape"}}) {
    if (!given) ZERO_THROW(InvalidArgument, "TorchPipeline: TorchStageFunctions.{} is not set", name);
  }
  const bool stage3 = engine.options().stage == 3;
  if (stage3 && pipe.schedule().split_backward) {
    ZERO_THROW(InvalidArgument,
               "TorchPipeline: schedule '{}' splits the backward, whose weight part walks each layer's graph again and "
               "reads its parameters, which stage 3 does not gather for it; use stage 0-2 or a schedule without the "
               "split", pipe.schedule().name);
  }
  for (int c = 0; c < pipe.chunks(); ++c) {
    const parallel::LayerRange range = pipe.layers(c);
    for (int l = range.first; l < range.end; ++l) {
      Layer L{.module = layer(l)};
      ZERO_CHECK(!L.module.is_empty(), "TorchPipeline: the layer function returned no module for layer {}", l);
      const ModulePlacements placements = module_placements(*L.module.ptr());
      for (const auto& item : L.module.ptr()->named_parameters(/*recurse=*/true)) {
        const std::string name = std::to_string(l) + "." + item.key();
        const torch::Tensor& t = item.value();
        check_registrable("TorchPipeline", name, t, stage3);
        std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
        if (shape.empty()) shape = {1};
        Param p{.name = name, .tensor = t, .trainable = t.requires_grad()};
        p.id = engine.add_param({.name = name,
                                 .shape = shape,
                                 .dtype = *engine_dtype(t.scalar_type()),
                                 .data = {t.data_ptr(), static_cast<size_t>(t.numel())},
                                 .unit = l,
                                 .requires_grad = p.trainable,
                                 .tp = placement_of(name, t, placements)});
        L.params.push_back(std::move(p));
      }
      impl_->layers.emplace(l, std::move(L));
    }
  }
}

TorchPipeline::~TorchPipeline() = default;

void TorchPipeline::finalize() {
  Impl& m = *impl_;
  if (m.finalized) ZERO_THROW(InvalidArgument, "TorchPipeline::finalize() called twice");
  const TorchStageFunctions& f = m.fns;
  m.pipe.finalize({
      .forward = [&m](const StageCall& c, const StageTensor& in, StageTensor& out) { return m.forward(c, in, out); },
      .backward = [&m](const StageCall& c, const StageTensor& dy, StageTensor& dx) { m.backward(c, dy, dx); },
      .weight = [&m](const StageCall& c) { m.weight(c); },
      .activation =
          [&f](int k, int samples) {
            return parallel::TensorSpec{static_cast<size_t>(numel_of(f.activation_shape(k, samples))), DType::kFloat32};
          },
  });
  if (!m.engine.params_resident()) {
    // The engine has read the initial values into its shards (the device may still be copying).
    m.engine.device().synchronize(m.engine.device().compute_stream(), m.engine.options().timeout);
    m.sharded = true;
    for (auto& [l, L] : m.layers) m.point(L, nullptr);
  }
  m.finalized = true;
}

torch::nn::AnyModule& TorchPipeline::layer(int l) { return impl_->layer(l).module; }

std::vector<std::pair<std::string, torch::Tensor>> TorchPipeline::parameters() {
  Impl& m = *impl_;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [l, L] : m.layers) {
    UnitScope scope = m.engine.gather(l);
    for (Param& p : L.params) {
      const torch::Tensor values = m.sharded && p.trainable ? view_of(scope.param(p.id), p.tensor) : p.tensor;
      out.emplace_back(p.name, values.detach().clone());
    }
  }
  return out;
}

}  // namespace zero::libtorch
