#include "adapters/libtorch/torch_engine.h"

#include "adapters/libtorch/module_params.h"

#include <ATen/ops/from_blob.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "base/check.h"
#include "base/error.h"

namespace zero::libtorch {

namespace {

// Whether `prefix` names `name` or one of its ancestors, on dot boundaries ("" names everything).
bool covers(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return true;
  return name == prefix || (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
                            name[prefix.size()] == '.');
}

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return s.empty() ? "none" : s;
}

}  // namespace

TorchEngine::TorchEngine(Engine& engine, torch::nn::Module& model, TorchEngineOptions options)
    : engine_(engine), model_(model), options_(std::move(options)) {
  if (engine.finalized()) ZERO_THROW(InvalidArgument, "TorchEngine: the engine is already finalized; register first");
  // The modules' tensors are views of the engine's memory in their own dtypes; a param_dtype would
  // have them read another dtype's bits.
  if (engine.options().param_dtype) {
    ZERO_THROW(InvalidArgument,
               "TorchEngine: EngineOptions.param_dtype {} is not supported: the adapter's modules compute on views of "
               "the parameters in their own dtypes (leave param_dtype unset, and convert the modules to compute in "
               "another dtype: module->to(torch::kBFloat16))",
               dtype_name(*engine.options().param_dtype));
  }
  const bool stage3 = engine.options().stage == 3;

  // The units: named modules or parameter names.
  std::map<std::string, const torch::nn::Module*> modules;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    modules[item.key()] = item.value().get();
  }
  const auto named = model.named_parameters(/*recurse=*/true);
  std::vector<std::string> unit_names = options_.units;
  if (unit_names.empty()) {
    if (!model.named_parameters(/*recurse=*/false).is_empty()) unit_names.push_back("");
    for (const auto& child : model.named_children()) unit_names.push_back(child.key());
  }
  std::set<std::string> seen;
  for (const std::string& name : unit_names) {
    if (!seen.insert(name).second) ZERO_THROW(InvalidArgument, "TorchEngineOptions.units: '{}' is listed twice", name);
    Unit u;
    u.name = name;
    const auto m = modules.find(name);
    if (m != modules.end()) {
      u.module = m->second;
    } else if (!name.empty() && named.find(name) == nullptr) {
      ZERO_THROW(InvalidArgument, "TorchEngineOptions.units: '{}' is neither a module path nor a parameter of the model",
                 name);
    }
    units_.push_back(std::move(u));
  }

  const ModulePlacements module_placement = module_placements(model);

  // Each parameter in the unit of its longest covering name. A tensor registered under two names
  // (tied weights) is one parameter, under its first name.
  std::map<const c10::TensorImpl*, std::string> first_name;
  for (const auto& item : named) {
    const std::string& name = item.key();
    const torch::Tensor& t = item.value();
    if (!first_name.emplace(t.unsafeGetTensorImpl(), name).second) continue;
    check_registrable("TorchEngine", name, t, stage3);
    int best = -1;
    for (size_t u = 0; u < units_.size(); ++u) {
      if (covers(units_[u].name, name) && (best < 0 || units_[u].name.size() > units_[static_cast<size_t>(best)].name.size())) {
        best = static_cast<int>(u);
      }
    }
    if (best < 0) {
      ZERO_THROW(InvalidArgument, "TorchEngine: parameter '{}' belongs to none of the units ({}); list it or a module above it",
                 name, join(unit_names));
    }
    Param p;
    p.name = name;
    p.tensor = t;
    p.unit = best;
    p.tp = placement_of(name, t, module_placement, options_.placement);
    p.trainable = t.requires_grad();
    units_[static_cast<size_t>(best)].params.push_back(params_.size());
    params_.push_back(std::move(p));
  }

  // Registered unit by unit, so that a unit's parameters are contiguous in the engine's layout.
  ids_.assign(params_.size(), -1);
  for (size_t u = 0; u < units_.size(); ++u) {
    for (size_t i : units_[u].params) {
      Param& p = params_[i];
      const int group = options_.group ? options_.group(p.name, p.tensor) : 0;
      std::vector<int64_t> shape(p.tensor.sizes().begin(), p.tensor.sizes().end());
      if (shape.empty()) shape = {1};  // a 0-d parameter is one element
      p.id = engine.add_param({.name = p.name,
                               .shape = shape,
                               .dtype = *engine_dtype(p.tensor.scalar_type()),
                               .data = {p.tensor.data_ptr(), static_cast<size_t>(p.tensor.numel())},
                               .unit = static_cast<int>(u),
                               .group = group,
                               .requires_grad = p.trainable,
                               .tp = p.tp});
      ids_[i] = p.id;
    }
  }
}

TorchEngine::~TorchEngine() {
  for (Param& p : params_) {
    if (!p.trainable || !finalized_) continue;
    p.tensor.remove_hook(p.pre_hook);
    if (p.accumulator) p.accumulator->del_post_hook(p.post_hook);
    p.tensor.mutable_grad().reset();
  }
  for (Unit& u : units_) {
    u.backward.reset();  // ends the scopes quietly (an error goes to the engine's next call)
    while (!u.forward.empty()) u.forward.pop_back();
  }
}

const std::string& TorchEngine::unit_name(int unit) const {
  if (unit < 0 || unit >= num_units()) ZERO_THROW(InvalidArgument, "TorchEngine: no unit {} ({} units)", unit, num_units());
  return units_[static_cast<size_t>(unit)].name;
}

int TorchEngine::unit(std::string_view name) const {
  std::vector<std::string> names;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].name == name) return static_cast<int>(u);
    names.push_back(units_[u].name);
  }
  ZERO_THROW(InvalidArgument, "TorchEngine: no unit '{}' (units: {})", name, join(names));
}

void TorchEngine::require_finalized(const char* what) const {
  if (!finalized_) ZERO_THROW(InvalidArgument, "TorchEngine::{}() before finalize()", what);
}

void TorchEngine::finalize() {
  if (finalized_) ZERO_THROW(InvalidArgument, "TorchEngine::finalize() called twice");
  engine_.finalize();
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.trainable) continue;
    // The hooks capture the adapter and an index, not the tensor: the tensor keeps its hooks, and a
    // hook holding the tensor would keep it alive forever.
    p.pre_hook = p.tensor.register_hook([this, i](const torch::Tensor&) { before_accumulate(i); });
    p.accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
    ZERO_CHECK(p.accumulator != nullptr, "parameter '{}' has no gradient accumulator", p.name);
    p.post_hook = p.accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          after_accumulate(i);
          return outputs;
        }));
  }
  if (!engine_.params_resident()) {
    // The engine has read the initial values into its shards (the device may still be copying).
    engine_.device().synchronize(engine_.device().compute_stream(), engine_.options().timeout);
    sharded_params_ = true;
    for (Param& p : params_) {
      // Frozen parameters stay resident in their own storage at every stage.
      if (p.trainable) libtorch::point_storage(p.tensor, nullptr);
    }
  }
  finalized_ = true;
}

void TorchEngine::point_storage(int unit, UnitScope* scope) {
  for (size_t i : units_[static_cast<size_t>(unit)].params) {
    Param& p = params_[i];
    if (!p.trainable) continue;
    void* ptr = scope != nullptr ? scope->param(p.id) : nullptr;
    libtorch::point_storage(p.tensor, ptr);
  }
}

torch::Tensor TorchEngine::forward_unit(int unit, const std::vector<torch::Tensor>& inputs,
                                        const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& fn) {
  require_finalized("forward_unit");
  unit_name(unit);  // checks the id
  Unit& u = units_[static_cast<size_t>(unit)];
  if (u.params.empty()) return fn(inputs);

  u.forward.push_back(engine_.gather(unit));
  if (sharded_params_) point_storage(unit, &u.forward.back());
  // Ends this forward scope on every way out; the storage then points at the scope still open for
  // the unit (a nested forward or its backward), or nowhere.
  struct Leave {
    TorchEngine* self;
    int unit;
    ~Leave() {
      Unit& u = self->units_[static_cast<size_t>(unit)];
      u.forward.pop_back();  // ends the scope (an error goes to the engine's next call)
      if (!self->sharded_params_) return;
      if (!u.forward.empty()) {
        self->point_storage(unit, &u.forward.back());
      } else {
        self->point_storage(unit, u.backward ? &*u.backward : nullptr);
      }
    }
  } leave{this, unit};

  const bool grad = torch::autograd::GradMode::is_enabled();
  std::vector<torch::Tensor> views;
  views.reserve(inputs.size());
  for (const torch::Tensor& x : inputs) {
    if (!grad || !x.defined() || !x.requires_grad()) {
      views.push_back(x);
      continue;
    }
    // The view's gradient is complete once every use of it inside the unit has run backward: that is
    // when the unit's backward work that needs its parameters is over.
    torch::Tensor v = x.view_as(x);
    v.register_hook([this, unit](const torch::Tensor&) {
      Unit& w = units_[static_cast<size_t>(unit)];
      --w.pending_inputs;
      maybe_close_backward(unit);
    });
    ++u.pending_inputs;
    views.push_back(std::move(v));
  }
  torch::Tensor out = fn(views);
  if (grad && out.defined() && out.requires_grad()) {
    // The output's gradient is complete before any of the unit's backward work starts.
    out.register_hook([this, unit](const torch::Tensor&) {
      if (!units_[static_cast<size_t>(unit)].backward) open_backward(unit);
    });
  }
  return out;
}

torch::Tensor TorchEngine::forward_unit(int unit, const torch::Tensor& input,
                                        const std::function<torch::Tensor(const torch::Tensor&)>& fn) {
  return forward_unit(unit, std::vector<torch::Tensor>{input},
                      [&fn](const std::vector<torch::Tensor>& in) { return fn(in[0]); });
}

torch::Tensor TorchEngine::forward(torch::nn::Sequential& sequential, const torch::Tensor& input) {
  torch::Tensor x = input;
  const auto children = sequential->named_children();
  size_t c = 0;
  for (torch::nn::AnyModule& child : *sequential) {
    const torch::nn::Module* m = child.ptr().get();
    int unit = -1;
    for (size_t u = 0; u < units_.size(); ++u) {
      if (units_[u].module == m) unit = static_cast<int>(u);
    }
    if (unit < 0) {
      if (!m->parameters().empty()) {
        ZERO_THROW(InvalidArgument,
                   "TorchEngine::forward: child {} ('{}') of the Sequential holds parameters but is not a unit; run "
                   "the unit that holds them with forward_unit()",
                   c, children[c].key());
      }
      x = child.forward(x);
    } else {
      x = forward_unit(unit, x, [&child](const torch::Tensor& in) { return child.forward(in); });
    }
    ++c;
  }
  return x;
}

void TorchEngine::open_backward(int unit) {
  Unit& u = units_[static_cast<size_t>(unit)];
  if (u.opened) {
    ZERO_THROW(InvalidArgument,
               "TorchEngine: a gradient reached unit '{}' after its backward scope had closed in this micro-step "
               "(its work read a tensor it was not given as an input, or it ran forward twice per backward)",
               u.name);
  }
  u.backward.emplace(engine_.gather_for_backward(unit));
  u.opened = true;
  u.pending_params = 0;
  for (size_t i : u.params) u.pending_params += params_[i].trainable ? 1 : 0;
  if (sharded_params_) point_storage(unit, &*u.backward);
}

void TorchEngine::maybe_close_backward(int unit) {
  Unit& u = units_[static_cast<size_t>(unit)];
  if (!u.backward || u.pending_params > 0 || u.pending_inputs > 0) return;
  UnitScope scope = std::move(*u.backward);
  u.backward.reset();
  if (sharded_params_) point_storage(unit, u.forward.empty() ? nullptr : &u.forward.back());
  scope.close();
}

void TorchEngine::before_accumulate(size_t i) {
  Param& p = params_[i];
  Unit& u = units_[static_cast<size_t>(p.unit)];
  if (!u.backward) open_backward(p.unit);
  p.grad_ptr = u.backward->grad(p.id);
  // AccumulateGrad reads .grad after this hook and adds into it in place.
  p.tensor.mutable_grad() = view_of(p.grad_ptr, p.tensor);
}

void TorchEngine::after_accumulate(size_t i) {
  Param& p = params_[i];
  const torch::Tensor& g = p.tensor.grad();
  if (p.grad_ptr == nullptr) {
    ZERO_THROW(InvalidArgument, "TorchEngine: parameter '{}' accumulated a gradient its hook did not see", p.name);
  }
  if (!g.defined() || g.data_ptr() != p.grad_ptr) {
    // AccumulateGrad replaced .grad (create_graph, or a layout it would not add into): the result
    // is the sum, so it goes over the engine's copy.
    torch::NoGradGuard no_grad;
    view_of(p.grad_ptr, p.tensor).copy_(g);
  }
  p.tensor.mutable_grad().reset();
  p.grad_ptr = nullptr;
  engine_.grad_ready(p.id);
  Unit& u = units_[static_cast<size_t>(p.unit)];
  --u.pending_params;
  maybe_close_backward(p.unit);
}

void TorchEngine::backward(const torch::Tensor& loss) {
  require_finalized("backward");
  const float scale = engine_.loss_scale();
  if (scale == 1.0f) {
    loss.backward();
  } else {
    (loss * scale).backward();
  }
  finish_backward();
}

void TorchEngine::reset_micro_step() {
  for (Unit& u : units_) {
    u.pending_inputs = u.pending_params = 0;
    u.opened = false;
  }
  for (Param& p : params_) {
    if (p.grad_ptr != nullptr) p.tensor.mutable_grad().reset();
    p.grad_ptr = nullptr;
  }
}

void TorchEngine::finish_backward() {
  require_finalized("finish_backward");
  // Last opened first: the order autograd would have closed them in.
  for (size_t u = units_.size(); u-- > 0;) {
    if (!units_[u].backward) continue;
    units_[u].pending_inputs = units_[u].pending_params = 0;
    maybe_close_backward(static_cast<int>(u));
  }
  reset_micro_step();
  engine_.finish_backward();
}

StepResult TorchEngine::step() {
  require_finalized("step");
  if (std::any_of(units_.begin(), units_.end(), [](const Unit& u) { return u.opened; })) finish_backward();
  return engine_.step();
}

std::vector<std::pair<std::string, torch::Tensor>> TorchEngine::full_parameters() {
  require_finalized("full_parameters");
  std::vector<torch::Tensor> values(params_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].params.empty()) continue;
    UnitScope scope = engine_.gather(static_cast<int>(u));
    for (size_t i : units_[u].params) values[i] = view_of(scope.param(params_[i].id), params_[i].tensor).clone();
    scope.close();
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back(params_[i].name, std::move(values[i]));
  return out;
}

}  // namespace zero::libtorch
