#pragma once
// The GPT's units in the engine's scopes. GptScopes registers the model's parameters with the engine
// (unit as the model numbers them, group 0 for the decayed ones, 1 for the rest, and the blocks'
// matrices in Muon's group 2 where the engine has one: examples/optimizer_groups.h), in fp32 or bf16,
// and turns the model's enter/leave into gather / gather_for_backward scopes, reading parameters and
// writing gradients through the open scope of their unit (more than one is open while unit 0's
// backward spans the others).
//
// bf16: the engine holds bf16 parameters and gradients (and the fp32 master), because they are
// registered in bf16 or because EngineOptions.param_dtype is bf16 (stage 3, fp32 registered). The
// model computes in fp32: entering a unit widens its bf16 parameters into fp32 copies, a backward
// scope collects their gradients in fp32 and adds them, rounded to bf16, into the engine's buffers
// when it closes. With `fp32_norms` the LayerNorm weights and every bias (the parameters without
// weight decay) stay fp32 beside the bf16 matrices and embeddings, as mixed-precision training keeps
// them: registered in fp32 (a bf16 model), or kept fp32 over EngineOptions.param_dtype by their
// ParamSpec.param_dtype (an fp32 model). The engine holds both dtypes; those are read in place.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/dtype.h"
#include "examples/gpt/gpt_model.h"
#include "examples/optimizer_groups.h"
#include "parallel/strategy/gpt2.h"  // gpt2_engine_options: the optimizer groups GptScopes fills
#include "zero/engine.h"

namespace zero::examples {


class GptScopes;

// Both copies of a tied weight on one rank (a V's rank 0 holds the embedding and the head): the chunk
// with the first copy lends it (registers it once, untied: no other rank holds a copy), the other
// borrows it (reads it through the lender's registration, and adds its gradient into a buffer of the
// lender's). The lender adds that buffer into the weight's gradient when the unit's last backward
// scope of the step closes, after its own part: the two parts summed once, E + H, as a tie between
// two ranks sums them, so the bits are the same as there.
struct GptTieOnRank {
  bool lends = false;
  GptScopes* lender = nullptr;  // set: borrow the lender's tied parameters
};

class GptScopes {
 public:
  // Registers `model`'s parameters (call before engine.finalize()). Keeps the engine and the model by
  // reference. In bf16 the registered storage is this object's, rounded from the model's values.
  GptScopes(Engine& engine, Gpt& model, DType dtype = DType::kFloat32, bool fp32_norms = false,
            GptTieOnRank tie = {})
      : engine_(engine), model_(model), tie_(tie) {
    ZERO_CHECK(dtype == DType::kFloat32 || dtype == DType::kBFloat16, "the GPT runs in fp32 or bf16");
    const size_t n = model.params().size();
    bf16_.resize(n);
    wide_.resize(n);
    wide_grad_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      Gpt::Param& p = model.params()[i];
      const GptParamDtypes d = gpt_param_dtypes(p.decay, dtype, fp32_norms);
      compute_.push_back(d.param_dtype.value_or(engine.options().param_dtype.value_or(d.registered)));
      ZERO_CHECK(compute_[i] == DType::kFloat32 || compute_[i] == DType::kBFloat16, "the GPT computes from fp32 or bf16");
      StorageRef data{p.values.data(), p.values.size()};
      if (d.registered == DType::kBFloat16) {
        bf16_[i].resize(p.values.size());
        for (size_t e = 0; e < p.values.size(); ++e) bf16_[i][e] = fp32_to_bf16_bits(p.values[e]);
        data = {bf16_[i].data(), bf16_[i].size()};
      }
      borrowed_.push_back(tie.lender != nullptr && p.tied);
      if (borrowed_.back()) {
        ids_.push_back(tie.lender->lend(p.name, p.values.size()));
        continue;
      }
      ids_.push_back(engine.add_param({.name = p.name, .shape = p.shape, .dtype = d.registered, .data = data,
                                       .unit = p.unit, .group = example_group(engine.options(), p.decay, hidden_matrix(p)),
                                       .tp = p.tp, .tied = p.tied && !tie.lends,
                                       .param_dtype = d.param_dtype}));
    }
    // The units whose parameters are all borrowed, and the lender's unit each reads (mixing is not
    // supported).
    for (size_t i = 0; i < n; ++i) {
      if (borrowed_[i]) borrowed_units_[model.params()[i].unit] = tie.lender->lent_.at(ids_[i]).unit;
    }
    for (size_t i = 0; i < n; ++i) {
      ZERO_CHECK(borrowed_[i] || !borrowed_units_.count(model.params()[i].unit),
                 "unit {} mixes borrowed and own parameters", model.params()[i].unit);
    }
  }
  // A block's matrix (not the embeddings, whose rows are looked up, nor the head tied to wte).
  static bool hidden_matrix(const Gpt::Param& p) { return p.shape.size() == 2 && p.name.rfind("h.", 0) == 0; }

  GptScopes(const GptScopes&) = delete;
  GptScopes& operator=(const GptScopes&) = delete;

  const std::vector<int>& ids() const { return ids_; }

  Gpt::Access access() {
    Gpt::Access a;
    a.enter = [this](int unit, Gpt::Pass pass) { enter(unit, pass); };
    a.leave = [this](int unit, Gpt::Pass pass) { leave(unit, pass); };
    a.param = [this](size_t i) -> const float* {
      return compute_[i] == DType::kFloat32 ? scope_of(i).param_as<float>(ids_[i]) : wide_[i].data();
    };
    a.grad = [this](size_t i) -> float* {
      if (borrowed_[i]) return tie_.lender->lent_.at(ids_[i]).grad.data();
      return compute_[i] == DType::kFloat32 ? scope_of(i).grad_as<float>(ids_[i]) : wide_grad_[i].data();
    };
    return a;
  }

 private:
  // A tied parameter of this (lending) model that a borrower of `numel` elements reads: its id.
  int lend(const std::string& name, size_t numel) {
    ZERO_CHECK(tie_.lends, "parameter '{}': the lending chunk was not made to lend", name);
    for (size_t i = 0; i < ids_.size(); ++i) {
      const Gpt::Param& p = model_.params()[i];
      if (p.name != name || !p.tied) continue;
      ZERO_CHECK_EQ(p.values.size(), numel);
      lent_[ids_[i]] = {std::vector<float>(numel, 0.0f), 0, p.unit};
      return ids_[i];
    }
    ZERO_THROW(InvalidArgument, "parameter '{}': the chunk that lends tied weights holds no such tied weight", name);
  }
  bool borrowed_unit(int unit) const { return borrowed_units_.count(unit) > 0; }
  // The lender, as its unit's last gradient-writing scope of the step closes: each lent parameter's
  // borrowed gradient (complete: the borrower's weight parts of the step all came first) added once.
  void add_lent(int unit, size_t i) {
    auto it = lent_.find(ids_[i]);
    if (it == lent_.end() || model_.params()[i].unit != unit) return;
    Lent& l = it->second;
    const int m = engine_.options().micro_batches;
    if (++l.passes < m) return;
    if (l.borrower_passes != m) {
      ZERO_THROW(InvalidArgument,
                 "tied parameter '{}': the schedule closed its last gradient scope on the chunk that holds it after {} "
                 "of the {} weight parts of the chunk that borrows it (those must come first)",
                 model_.params()[i].name, l.borrower_passes, m);
    }
    float* g = compute_[i] == DType::kFloat32 ? scope_of(i).grad_as<float>(ids_[i]) : wide_grad_[i].data();
    for (size_t e = 0; e < l.grad.size(); ++e) g[e] += l.grad[e];
    std::fill(l.grad.begin(), l.grad.end(), 0.0f);
    l.passes = l.borrower_passes = 0;
  }

  static bool reads_params(Gpt::Pass pass) { return pass != Gpt::Pass::kBackwardWeight; }
  static bool writes_grads(Gpt::Pass pass) {
    return pass == Gpt::Pass::kBackward || pass == Gpt::Pass::kBackwardWeight;
  }
  void enter(int unit, Gpt::Pass pass) {
    if (borrowed_unit(unit)) {
      // The lender's registration read (a backward's input part, which counts toward no gradient);
      // a weight part reads nothing and writes the borrowed gradient.
      if (pass == Gpt::Pass::kForward) {
        open_[unit].emplace(engine_.gather(borrowed_units_.at(unit)));
      } else if (reads_params(pass)) {
        open_[unit].emplace(engine_.gather_for_backward(borrowed_units_.at(unit), BackwardPart::kInput));
      }
      widen(unit, pass);
      return;
    }
    switch (pass) {
      case Gpt::Pass::kForward: open_[unit].emplace(engine_.gather(unit)); break;
      case Gpt::Pass::kBackward: open_[unit].emplace(engine_.gather_for_backward(unit)); break;
      case Gpt::Pass::kBackwardInput: open_[unit].emplace(engine_.gather_for_backward(unit, BackwardPart::kInput)); break;
      case Gpt::Pass::kBackwardWeight:
        open_[unit].emplace(engine_.gather_for_backward(unit, BackwardPart::kWeight));
        break;
    }
    widen(unit, pass);
  }
  // bf16: the unit's parameters widened to fp32 where the pass reads them, fp32 gradients zeroed
  // where it writes them (the borrowed ones go to the lender's buffer, in fp32).
  void widen(int unit, Gpt::Pass pass) {
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (model_.params()[i].unit != unit || compute_[i] == DType::kFloat32) continue;
      wide_[i].resize(model_.params()[i].values.size());
      if (reads_params(pass)) {
        const auto* v = static_cast<const uint16_t*>(open_[unit]->param(ids_[i]));
        for (size_t e = 0; e < wide_[i].size(); ++e) wide_[i][e] = bf16_bits_to_fp32(v[e]);
      }
      if (writes_grads(pass) && !borrowed_[i]) wide_grad_[i].assign(wide_[i].size(), 0.0f);
    }
  }
  void leave(int unit, Gpt::Pass pass) {
    if (borrowed_unit(unit)) {
      if (writes_grads(pass)) {
        for (size_t i = 0; i < ids_.size(); ++i) {
          if (model_.params()[i].unit == unit) ++tie_.lender->lent_.at(ids_[i]).borrower_passes;
        }
      }
      if (open_.count(unit)) open_.at(unit).reset();
      return;
    }
    if (writes_grads(pass)) {
      for (size_t i = 0; i < ids_.size(); ++i) add_lent(unit, i);
      for (size_t i = 0; i < ids_.size(); ++i) {
        if (model_.params()[i].unit != unit || compute_[i] == DType::kFloat32) continue;
        auto* g = static_cast<uint16_t*>(open_[unit]->grad(ids_[i]));
        for (size_t e = 0; e < wide_grad_[i].size(); ++e) g[e] = fp32_to_bf16_bits(bf16_bits_to_fp32(g[e]) + wide_grad_[i][e]);
      }
    }
    open_.at(unit).reset();
  }
  UnitScope& scope_of(size_t i) { return *open_.at(model_.params()[i].unit); }

  Engine& engine_;
  Gpt& model_;
  std::vector<DType> compute_;  // each parameter's dtype in the engine (its gradients' too)
  std::vector<int> ids_;
  std::vector<std::vector<uint16_t>> bf16_;                // bf16 parameters: the registered storage
  std::vector<std::vector<float>> wide_, wide_grad_;       // bf16: fp32 views of the open units
  std::map<int, std::optional<UnitScope>> open_;
  GptTieOnRank tie_;
  std::vector<bool> borrowed_;          // per parameter: read through the lender's registration
  std::map<int, int> borrowed_units_;  // this model's units whose parameters are borrowed -> the lender's unit
  struct Lent {
    std::vector<float> grad;  // the borrower's part of the gradient, this step
    int borrower_passes = 0;  // the borrower's gradient-writing scopes this step
    int unit = 0;             // the lender's unit
    int passes = 0;           // the lender's gradient-writing scopes of that unit this step
  };
  std::map<int, Lent> lent_;  // by engine id
};

}  // namespace zero::examples
