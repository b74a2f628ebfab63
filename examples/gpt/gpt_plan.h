#pragma once
// The GPT as the planner sees it (zero/plan/): its parameters from Gpt::layout (no values) with
// GptScopes' units and groups, and the scope schedule of one micro-step of train_gpt's loop, recorded
// from the model's own forward and backward on a copy one element wide per head (the order of its
// enter/leave calls does not depend on the widths). Where GptScopes touches the engine's gradients
// is mirrored: in fp32 when the model asks for them, in bf16 when a backward scope closes.
#include "base/dtype.h"
#include "examples/gpt/gpt_model.h"
#include "zero/plan/model_spec.h"

namespace zero::examples {

// `tp` > 1: one tensor-parallel rank's parts (Gpt(full, parallel)'s shapes and placements; the
// vocabulary padded to a multiple of tp); `sequence_parallel`: replicated ones with partial gradients.
// `stage` (not null): one pipeline stage's tensors (Gpt(full, parallel, stage)'s, the tied wte copy
// marked) and that stage's scope schedule for one micro-batch. `fp32_norms`: LayerNorm weights and
// biases in fp32, as GptScopes keeps them (registered fp32 in a bf16 model, ParamSpec.param_dtype
// fp32 in an fp32 one).
plan::ModelSpec gpt_model_spec(const GptConfig& config, DType dtype, int tp = 1, bool sequence_parallel = false,
                               const GptStage* stage = nullptr, bool fp32_norms = false);

}  // namespace zero::examples
