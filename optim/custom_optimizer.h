#pragma once
// An update rule the user brings (docs/optim.md, "Your own optimizer"). The engine keeps the fp32
// master weights and the rule's state, shards them as its stage says, saves and loads them with
// checkpoints, and places them where offload puts them; the rule only updates the elements it is
// handed. Set EngineOptions.optimizer.custom to use one (optimizer.kind is then ignored).
//
// The contract, elementwise: update(context, range) reads grad[i] and may read and write master[i]
// and state[s][i] for i in [0, range.numel), and element i's new values depend only on element i's
// old ones and the scalars (the group's hyperparameters, the step). Then how the elements are split
// (the world size, the stage, buckets, calls) changes no bit of the result, as for the built-in
// optimizers. A rule that needs a whole tensor at once (LAMB's or LARS's trust ratio, Shampoo, Muon)
// says so with needs_whole_tensors(): the engine's flat ranges cut tensors across ranks, so it
// refuses such a rule at finalize(), naming it.
//
// Around update(): the gradient arrives in fp32, unscaled and clipped (the loss scale and the clip
// coefficient applied); a step skipped for overflow calls nothing; afterwards the engine writes the
// new master weights into the model's dtype. The state arrays are fp32, zero at the start, as long
// as the master shard; checkpoints hold them under state_names(). update() is called from one
// thread at a time (the engine's, or the offload pipeline's), a step's ranges in increasing order,
// padding never passed.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "optim/optimizer.h"

namespace zero::optim {

// Elements of one parameter that this rank updates, and where their data is.
struct OwnedRange {
  std::string_view param;    // the parameter's registered name
  size_t param_offset = 0;   // element offset of master[0] within the whole parameter (flat, row-major)
  size_t numel = 0;
  int group = 0;             // index into EngineOptions.optimizer.groups
  float* master = nullptr;   // numel fp32 master weights, updated in place
  const float* grad = nullptr;     // numel fp32 gradients
  std::span<float* const> state;   // one array per state_names() entry, numel elements each
};

struct UpdateContext {
  int64_t step = 0;  // this step's number, from 1 (for bias corrections)
  std::span<const Hyper> groups;  // the engine's parameter groups, as a schedule has set them
};

class CustomOptimizer {
 public:
  virtual ~CustomOptimizer() = default;
  // For errors, the checkpoint manifest and the ranks' agreement on options ("adabelief").
  virtual std::string name() const = 0;
  // The per-element state arrays, in order (their checkpoint names).
  virtual std::vector<std::string> state_names() const = 0;
  // Throws InvalidArgument naming "groups[<index>].<field>" for a hyperparameter outside the rule's
  // range; called at finalize() and before every step (a schedule may change them).
  virtual void validate(const Hyper& group, int group_index) const {
    (void)group;
    (void)group_index;
  }
  virtual bool needs_whole_tensors() const { return false; }
  virtual void update(const UpdateContext& context, const OwnedRange& range) = 0;
};

}  // namespace zero::optim
