#include "adapters/libtorch/torch_pipeline.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/container/any.h>
#include <torch/utils.h>

#include <fmt/format.h>

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

struct Lent;

struct Param {
  std::string name;  // "<layer>.<name>" (a tied copy: the first's)
  torch::Tensor tensor;
  int id = -1;
  bool trainable = true;
  Lent* borrows = nullptr;  // a tied weight's last copy on the rank that holds the first: unregistered
};

// A tied weight whose two copies this rank holds (torch_pipeline.h): the last's gradient over the
// step, and the two layers' gradient-writing passes of the step, which must end with the first's.
struct Lent {
  Param* lender = nullptr;  // the first's copy, registered
  std::string borrower;     // the last's name, for messages
  int lender_layer = 0, borrower_layer = 0;
  torch::Tensor grad;
  int lender_passes = 0, borrower_passes = 0;
};

struct Layer {
  torch::nn::AnyModule module;
  std::vector<Param> params;
  Lent* borrows = nullptr;  // the layer reads a tied weight through the first layer's copy
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
  std::vector<std::unique_ptr<Lent>> lent;
  bool sharded = false;         // stage 3: parameter storage points at gathered copies in scopes only
  bool finalized = false;

  Impl(Engine& e, parallel::PipelineStage& p, TorchStageFunctions f) : engine(e), pipe(p), fns(std::move(f)) {}

  Layer& layer(int l) {
    const auto it = layers.find(l);
    if (it == layers.end()) {
      std::vector<int> held;
      for (const auto& [index, unused] : layers) held.push_back(index);
      ZERO_THROW(InvalidArgument, "TorchPipeline: layer {} is not in this rank's chunks, which hold layers {}", l,
                 fmt::join(held, ", "));
    }
    return it->second;
  }

  // The layer's trainable parameters' storage at `scope`'s copies (stage 3), a borrowed tied weight's
  // at the first layer's (`lender`), or at nothing.
  void point(Layer& layer, UnitScope* scope, UnitScope* lender = nullptr) {
    if (!sharded) return;
    for (Param& p : layer.params) {
      if (!p.trainable) continue;
      UnitScope* from = p.borrows != nullptr ? lender : scope;
      point_storage(p.tensor, from != nullptr ? from->param(p.borrows != nullptr ? p.borrows->lender->id : p.id) : nullptr);
    }
  }

  // Stage 3: the first layer's gathered copies for a layer that borrows a tied weight, opened beside
  // its own scope (a backward's as an input part: it reads them, and counts toward no gradient).
  void open_lender(std::optional<UnitScope>& scope, const Layer& layer, bool backward) {
    if (!sharded || layer.borrows == nullptr) return;
    const int unit = layer.borrows->lender_layer;
    if (backward) {
      scope.emplace(engine.gather_for_backward(unit, BackwardPart::kInput));
    } else {
      scope.emplace(engine.gather(unit));
    }
  }

  // Adds the parameters' gradients (undefined: the layer did not use it) into the engine's, a
  // borrowed tied weight's into its step's sum.
  static void accumulate(UnitScope& scope, const std::vector<Param*>& params, const std::vector<torch::Tensor>& grads,
                         size_t first) {
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& g = grads[first + i];
      if (!g.defined()) continue;
      if (params[i]->borrows != nullptr) {
        params[i]->borrows->grad.add_(g);
      } else {
        view_of(scope.grad(params[i]->id), params[i]->tensor).add_(g);
      }
    }
  }

  // After layer l's gradient-writing pass (kAll or kWeight) inside `scope`: counts the pass, and as
  // the first layer's last pass of the step ends, adds the borrowed copy's gradient of the step into
  // the first's, once (the last's passes must have come first).
  void settle(int l, UnitScope& scope) {
    const int m = engine.options().micro_batches;
    for (const std::unique_ptr<Lent>& t : lent) {
      if (t->borrower_layer == l) ++t->borrower_passes;
      if (t->lender_layer != l || ++t->lender_passes < m) continue;
      if (t->borrower_passes != m) {
        ZERO_THROW(InvalidArgument,
                   "TorchPipeline: tied weight '{}': the schedule ran layer {}'s last backward of the step after {} of "
                   "the {} backwards of layer {}, which reads it as '{}' (those must come first)",
                   t->lender->name, l, t->borrower_passes, m, t->borrower_layer, t->borrower);
      }
      view_of(scope.grad(t->lender->id), t->lender->tensor).add_(t->grad);
      t->grad.zero_();
      t->lender_passes = t->borrower_passes = 0;
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
      std::optional<UnitScope> lender;
      open_lender(lender, L, /*backward=*/false);
      point(L, &scope, lender ? &*lender : nullptr);
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
      const int l = call.layers.first + static_cast<int>(i);
      Layer& L = layer(l);
      UnitScope scope = engine.gather_for_backward(l, call.part);
      std::optional<UnitScope> lender;
      open_lender(lender, L, /*backward=*/true);
      point(L, &scope, lender ? &*lender : nullptr);
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
      if (!split) settle(l, scope);
      point(L, nullptr);
      g = next;
    }
    if (!call.first) {
      ZERO_CHECK(g.defined(), "TorchPipeline: virtual stage {}'s input took no gradient", call.virtual_stage);
      fill(grad_input, g, call.virtual_stage, "input gradient");
    }
  }

  // kWeight after kInput: each layer's parameters' gradients from its output's kept gradient,
  // walking the layer's retained graph again. That walk may read the parameters (the graph's saved
  // tensors are the parameters themselves), which a kWeight scope does not gather at stage 3: there a
  // second scope, an input part that writes no gradient, gathers them for it.
  void weight(const StageCall& call) {
    Saved& s = *std::any_cast<std::shared_ptr<Saved>&>(call.context);
    for (size_t i = s.outputs.size(); i-- > 0;) {
      const int l = call.layers.first + static_cast<int>(i);
      Layer& L = layer(l);
      UnitScope scope = engine.gather_for_backward(l, BackwardPart::kWeight);
      std::optional<UnitScope> reader, lender;
      if (sharded) reader.emplace(engine.gather_for_backward(l, BackwardPart::kInput));
      open_lender(lender, L, /*backward=*/true);
      point(L, reader ? &*reader : nullptr, lender ? &*lender : nullptr);
      const std::vector<Param*> params = trainable(L);
      if (!params.empty()) {
        std::vector<torch::Tensor> inputs;
        for (Param* p : params) inputs.push_back(p->tensor);
        const std::vector<torch::Tensor> grads = torch::autograd::grad({s.outputs[i]}, inputs, {s.output_grads[i]},
                                                                       /*retain_graph=*/false, /*create_graph=*/false,
                                                                       /*allow_unused=*/true);
        accumulate(scope, params, grads, 0);
      }
      point(L, nullptr);
      settle(l, scope);
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
  // Where the tied weights' copies are: layer 0 (the first virtual stage's) and the last layer.
  int last_layer = -1;
  bool holds_first = false;
  for (int c = 0; c < pipe.chunks(); ++c) {
    holds_first = holds_first || pipe.is_first(c);
    if (pipe.is_last(c)) last_layer = pipe.layers(c).end - 1;
  }
  const bool holds_both = holds_first && last_layer >= 0;
  for (const TiedWeight& t : f.tied) {
    if (t.first.rfind("0.", 0) != 0) {
      ZERO_THROW(InvalidArgument, "TorchPipeline: tied weight '{}' is not a parameter of layer 0 (\"0.<name>\")", t.first);
    }
    if (last_layer == 0) ZERO_THROW(InvalidArgument, "TorchPipeline: tied weight '{}': the model has one layer", t.first);
    if (last_layer > 0 && t.last.rfind(std::to_string(last_layer) + ".", 0) != 0) {
      ZERO_THROW(InvalidArgument, "TorchPipeline: tied weight '{}': its copy '{}' is not a parameter of the last layer, {}",
                 t.first, t.last, last_layer);
    }
  }
  auto tie_of = [&f](const std::string& name, bool last) -> const TiedWeight* {
    for (const TiedWeight& t : f.tied) {
      if ((last ? t.last : t.first) == name) return &t;
    }
    return nullptr;
  };
  std::map<std::string, Param*> found;  // the tied names this rank holds
  for (int c = 0; c < pipe.chunks(); ++c) {
    const parallel::LayerRange range = pipe.layers(c);
    for (int l = range.first; l < range.end; ++l) {
      Layer& L = impl_->layers.emplace(l, Layer{.module = layer(l)}).first->second;
      ZERO_CHECK(!L.module.is_empty(), "TorchPipeline: the layer function returned no module for layer {}", l);
      const ModulePlacements placements = module_placements(*L.module.ptr());
      const auto named = L.module.ptr()->named_parameters(/*recurse=*/true);
      L.params.reserve(named.size());  // `found` points into it
      for (const auto& item : named) {
        const std::string name = std::to_string(l) + "." + item.key();
        const torch::Tensor& t = item.value();
        check_registrable("TorchPipeline", name, t, stage3);
        const TiedWeight* first = l == 0 ? tie_of(name, false) : nullptr;
        const TiedWeight* last = l == last_layer ? tie_of(name, true) : nullptr;
        Param& p = L.params.emplace_back(Param{.name = last ? last->first : name, .tensor = t, .trainable = t.requires_grad()});
        if (first || last) found[last ? last->last : name] = &p;
        if (last && holds_both) continue;  // borrows the first's copy (below)
        std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
        if (shape.empty()) shape = {1};
        p.id = engine.add_param({.name = p.name,
                                 .shape = shape,
                                 .dtype = *engine_dtype(t.scalar_type()),
                                 .data = {t.data_ptr(), static_cast<size_t>(t.numel())},
                                 .unit = l,
                                 .requires_grad = p.trainable,
                                 .tp = placement_of(name, t, placements),
                                 .tied = (first || last) && !holds_both});
      }
    }
  }
  for (const TiedWeight& t : f.tied) {
    for (const auto& [name, held] : {std::pair{t.first, holds_first}, std::pair{t.last, last_layer >= 0}}) {
      if (held && !found.count(name)) ZERO_THROW(InvalidArgument, "TorchPipeline: tied weight '{}' is no parameter of its layer", name);
    }
    if (!holds_both) continue;
    Param& lender = *found.at(t.first);
    Param& borrower = *found.at(t.last);
    if (!lender.tensor.sizes().equals(borrower.tensor.sizes()) || lender.tensor.scalar_type() != borrower.tensor.scalar_type() ||
        lender.trainable != borrower.trainable) {
      ZERO_THROW(InvalidArgument, "TorchPipeline: tied weight '{}' is {} {}{}, its copy '{}' {} {}{}", t.first,
                 c10::toString(lender.tensor.scalar_type()), c10::str(lender.tensor.sizes()), lender.trainable ? "" : " (frozen)",
                 t.last, c10::toString(borrower.tensor.scalar_type()), c10::str(borrower.tensor.sizes()),
                 borrower.trainable ? "" : " (frozen)");
    }
    auto tie = std::make_unique<Lent>(Lent{.lender = &lender, .borrower = t.last, .lender_layer = 0,
                                           .borrower_layer = last_layer, .grad = torch::zeros_like(lender.tensor)});
    borrower.borrows = tie.get();
    impl_->layers.at(last_layer).borrows = tie.get();
    // Stages 0-2: the last's tensor reads the first's storage (stage 3 points both at gathered copies).
    if (!stage3) point_storage(borrower.tensor, lender.tensor.data_ptr());
    impl_->lent.push_back(std::move(tie));
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
      if (p.borrows != nullptr) continue;  // listed by the first layer's copy
      const torch::Tensor values = m.sharded && p.trainable ? view_of(scope.param(p.id), p.tensor) : p.tensor;
      out.emplace_back(p.name, values.detach().clone());
    }
  }
  return out;
}

}  // namespace zero::libtorch
