#include "examples/gpt/gpt_plan.h"

#include <set>
#include <vector>

#include "base/check.h"

namespace zero::examples {

plan::ModelSpec gpt_model_spec(const GptConfig& config, DType dtype, int tp, bool sequence_parallel,
                               const GptStage* stage, bool fp32_norms) {
  const GptStage whole{0, config.n_layer, true, true};
  const GptStage& part = stage != nullptr ? *stage : whole;
  ZERO_CHECK(dtype == DType::kFloat32 || dtype == DType::kBFloat16, "the GPT runs in fp32 or bf16");
  if (tp < 1 || config.n_head % tp != 0) {
    ZERO_THROW(InvalidArgument, "tensor parallelism: n_head {} does not divide by tp {} (each rank holds whole heads)",
               config.n_head, tp);
  }
  if (sequence_parallel && tp == 1) ZERO_THROW(InvalidArgument, "sequence parallelism needs tp above 1");
  plan::ModelSpec m;
  m.dtype = dtype;
  const std::vector<Gpt::ParamLayout> layout = Gpt::layout(config);
  for (size_t i = 0; i < layout.size(); ++i) {
    if (!Gpt::holds(config, part, i)) continue;
    const Gpt::ParamLayout& p = layout[i];
    std::vector<int64_t> shape = p.shape;
    TpPlacement placement;
    if (tp > 1) {
      placement = Gpt::placement(p.name, sequence_parallel);
      if (p.name == "wte.weight") shape[0] = parallel::padded_vocab(config.vocab_size, tp);
      shape = local_shape(p.name, shape, placement, tp);
    }
    m.tensors.push_back({p.name, shape, p.unit, true, p.decay ? 0 : 1, placement, i == 0 && part.first != part.last});
    const GptParamDtypes d = gpt_param_dtypes(p.decay, dtype, fp32_norms);  // as GptScopes registers it
    if (d.registered != dtype) m.tensors.back().dtype = d.registered;
    m.tensors.back().param_dtype = d.param_dtype;
  }
  // The same units on a model too small to cost anything: its scopes and gradient requests do not
  // depend on the widths or the heads (at one head of width one it builds in microseconds, where the
  // model's own head count made a 70B shape's scope schedules a fifth of a strategy search).
  GptConfig tiny = config;
  tiny.vocab_size = 2;
  tiny.block_size = 2;
  tiny.n_head = 1;
  tiny.n_embd = 1;
  Gpt model(Gpt(tiny, 1), {}, part);
  std::vector<std::vector<float>> grads;
  for (const Gpt::Param& p : model.params()) grads.emplace_back(p.values.size(), 0.0f);
  std::set<size_t> asked;  // gradients asked for in the open backward scopes
  std::vector<plan::ScopeEvent>& events = m.schedule;
  Gpt::Access a;
  a.enter = [&](int unit, Gpt::Pass pass) {
    events.push_back({plan::ScopeEvent::kOpen, unit, pass != Gpt::Pass::kForward, 0});
  };
  a.leave = [&](int unit, Gpt::Pass pass) {
    const bool backward = pass != Gpt::Pass::kForward;
    if (backward) {
      for (size_t i = 0; i < m.tensors.size(); ++i) {
        if (m.tensors[i].unit == unit && m.dtype_of(m.tensors[i]) == DType::kBFloat16) {
          events.push_back({plan::ScopeEvent::kGrad, unit, true, i});
        }
      }
    }
    events.push_back({plan::ScopeEvent::kClose, unit, backward, 0});
  };
  a.param = [&](size_t i) -> const float* { return model.params()[i].values.data(); };
  a.grad = [&](size_t i) -> float* {
    if (m.dtype_of(m.tensors[i]) == DType::kFloat32 && asked.insert(i).second) {
      events.push_back({plan::ScopeEvent::kGrad, m.tensors[i].unit, true, i});
    }
    return grads[i].data();
  };
  const std::vector<int> tokens = {0, 1}, targets = {1, 0};
  const std::vector<float> input(model.activation_numel(1, 2), 0.0f);
  std::vector<float> out, grad_in;
  model.forward_micro_batch(0, tokens, targets, 1, 2, input.data(), &out, a);
  const std::vector<float> grad_out(out.size(), 0.0f);
  model.backward_micro_batch(0, 1.0f, grad_out.data(), &grad_in, true, a);
  return m;
}

}  // namespace zero::examples
