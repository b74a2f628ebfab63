#pragma once
// GradFinalizer: a rule that completes some parameters' gradients beyond the data-parallel
// reduction, owned by the parallelism that needs it (Megatron-core's finalize_model_grads, as hooks
// the engine calls at fixed points). parallel/ implements them (tensor parallelism's in
// parallel/tensor/tp_grads.h, the tied copies' in parallel/pipeline/tied_grads.h) and
// parallel::engine_comms(mesh) hands them to the engine (EngineComms::finalizers); zero/ knows this
// interface only. The engine knows the kinds of parameter a finalizer may claim, not why:
//
//   claims  the parameters it answers for: a parameter whose registration needs a finalizer (a
//           split placement, a tied copy: needs_finalizer() in zero/param_registry.h) that none
//           claims is refused at finalize(), naming it;
//   copies  every rank of group() holds the same tensor whole (a tensor replicated over tensor
//           parallelism; a tied embedding that the first and the last pipeline stage both hold):
//           the global norm counts it on the group's rank 0 only, and such tensors never share a
//           norm block with others (ShardLayout's block starts);
//   held    its gradient is incomplete when backward ends: the engine leaves it out of the data-
//           parallel reduction until finish_backward(), where complete_held() completes it (the
//           tied copies summed over the stages that hold one) and it is marked ready;
//   summed  its reduced gradient is a partial sum over group() (each tensor-parallel rank saw only
//           its own tokens): the update sums those pieces over the group before the norm reads them.
//
//   Engine::finalize()        check()           registration problems, noted on the registry for
//                                               its cross-rank report (collective over group())
//                             initial_values()  after the data-parallel broadcast of the initial
//                                               values: the copies brought in step, or compared
//   Engine::finish_backward() complete_held()   per held gradient, when the micro-step reduces
//   Engine::step()            (summed)          one all-reduce per dtype over group()
//
// The engine binds each to its device at construction (bind(): the group must pair with the
// device's memory), runs the registry's and the options' agreement over group() when
// same_registration(), and compares the group's calls at each step's end.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "comm/communicator.h"
#include "memory/device.h"
#include "optim/optimizer.h"
#include "zero/param_registry.h"
#include "zero/split_tensor.h"

namespace zero {

class GradFinalizer {
 public:
  virtual ~GradFinalizer() = default;

  // What it finalizes, for messages and the options' agreement ("tensor-parallel", "tied").
  virtual std::string name() const = 0;
  // The ranks it works across (never null).
  virtual comm::Communicator* group() const = 0;
  // The group across which the tensors it claims are split, each rank holding a slice (checkpoints
  // store the slices); null where it splits none.
  virtual comm::Communicator* splits_over() const = 0;
  // Every rank of group() registers the same parameters and options (the engine checks both over it).
  virtual bool same_registration() const = 0;

  // Once, by the engine's constructor: where its buffers live and its collectives' timeout. One
  // finalizer serves one engine (InvalidArgument on a second bind).
  virtual void bind(memory::Device& device, std::chrono::milliseconds timeout) = 0;

  virtual void check(ParamRegistry& registry) = 0;
  virtual void initial_values(const ParamRegistry& registry) = 0;

  virtual bool claims(const ParamSpec& p) const = 0;
  virtual bool copies(const ParamSpec& p) const = 0;
  virtual bool holds(const ParamSpec& p) const = 0;
  virtual bool sums_reduced(const ParamSpec& p) const = 0;

  // A held parameter's gradient (numel elements of `dtype` at `grad`, where backward accumulated
  // it, written on the device's compute stream), completed in stream order.
  virtual void complete_held(const ParamSpec& p, void* grad, DType dtype) = 0;
  // Update time, for an optimizer whose update needs the whole tensor (Muon, Adafactor, a custom
  // rule's optim::CustomOptimizer::needs_whole_tensors): how a parameter it splits across ranks lies
  // in the whole tensor and how it is gathered whole (zero/split_tensor.h); empty where it splits
  // none (or its group is one rank: the part is the whole).
  virtual SplitTensor split(const ParamSpec& p) const {
    (void)p;
    return {};
  }
};

// An engine's finalizers, in the order it runs them.
using GradFinalizers = std::vector<std::shared_ptr<GradFinalizer>>;

}  // namespace zero
