#pragma once
// The engine under a LibTorch C++ loop (docs/libtorch.md): torch::nn modules, autograd and the loss
// stay as they are; TorchEngine takes the place of torch::optim.
//
//   zero::Engine engine(*pg.host, options);                 // stage, AdamW hyperparameters, clipping
//   zero::libtorch::TorchEngine zt(engine, *model);          // registers the module's parameters
//   zt.finalize();                                           // collective: rank 0's values everywhere
//   for (step...) {
//     torch::Tensor loss = loss_fn(zt.forward(model, x), y); // a Sequential; or forward_unit() calls
//     zt.backward(loss);                                     // autograd; buckets reduce during it
//     zt.step();                                             // instead of optimizer.step()/zero_grad()
//   }
//
// Registration. Every parameter of the module (named_parameters(): float, bfloat16 or half, each its
// own, as a model converted to bf16 but for some layers; CPU, contiguous) is registered by pointer, in
// its dtype: the engine reads and updates the tensor's own storage below stage 3. Units
// (what stage 3 gathers at once) are module paths or parameter names; each parameter joins the unit
// whose name is its longest dot-boundary prefix. By default each direct child module is a unit (in
// registration order), and the root's own parameters, if it has any, one more unit named "", first.
//
// Gradients. LibTorch 1.13's Tensor::register_hook cannot stop autograd from accumulating into
// .grad: a hook returning an undefined tensor means "unchanged", and a zero tensor still makes
// AccumulateGrad allocate and fill a full .grad. So the adapter does what PyTorch's own DDP does with
// gradient_as_bucket_view: a hook on each parameter (run by AccumulateGrad just before it adds)
// points the parameter's .grad at the engine's gradient storage for it (torch::from_blob, no copy),
// AccumulateGrad adds the gradient there in place, and a post hook on the parameter's gradient
// accumulator (which the adapter keeps alive) marks it ready, so its bucket reduces while autograd
// goes on. Afterwards .grad is reset to undefined: that memory is the engine's again. The pointer is
// asked for only when the gradient arrives, so at stage 2 a bucket's staging exists only while its
// gradients do. (Should AccumulateGrad replace .grad instead of adding in place, as it does under
// create_graph, the post hook copies the result over.)
//
// Units and stage 3. Forward hooks do not exist on C++ modules in 1.13, so the loop runs each unit
// through forward_unit() (or forward() for a Sequential whose children are the units). It opens
// the unit's gather scope and, at stage 3, points each parameter's storage at the gathered copy
// (every view of the parameter, autograd's saved ones included, reads through that storage, as
// FSDP's do); it hooks the unit's output, whose gradient autograd completes before any of the
// unit's backward work, to open the unit's backward scope there (stage 3: gathered again, so
// reshard_after_forward may stay true), and hooks a view of each input, whose gradient is complete
// only once all of the unit's backward work is done, to close it (together with the unit's
// parameters' accumulations). Between its scopes a stage-3 parameter's storage is empty (a null
// pointer: a unit's parameters used outside its forward_unit crash the process); its own memory is
// released at finalize(). Below stage 3 the scopes cost nothing and forward_unit is optional.
// Caveats: a unit's work must take its inputs from forward_unit's inputs, not from captured
// tensors; one forward per backward; a unit's parameter that gets no gradient keeps its scope open
// until finish_backward().
//
// Threads: LibTorch runs a CPU backward on the calling thread, so every hook calls the engine from
// the loop's thread. Buffers (BatchNorm's running statistics) are not registered or synchronized.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include "zero/engine.h"
#include "zero/tp_placement.h"

namespace zero::libtorch {

struct TorchEngineOptions {
  // Unit names: module paths as named_modules() spells them ("blocks.0") or parameter names. Empty:
  // the direct children, and "" for the root's own parameters (see the header comment).
  std::vector<std::string> units;
  // The optimizer parameter group (EngineOptions.optimizer.groups index) of each parameter;
  // unset: group 0 for all.
  std::function<int(const std::string& name, const torch::Tensor& param)> group;
  // The tensor-parallel placement (ParamSpec::tp) of each parameter that no TensorParallelModule
  // (adapters/libtorch/tensor_parallel.h) places itself: a LayerNorm's gains under sequence
  // parallelism are TpPlacement::replicated_partial(). Unset, or nullopt for a parameter: replicated.
  // A placement given for a tensor-parallel module's parameter must be the module's own.
  std::function<std::optional<TpPlacement>(const std::string& name, const torch::Tensor& param)> placement;
};

class TorchEngine {
 public:
  // Registers every parameter of `model` with `engine` (before engine.finalize()); keeps both by
  // reference. Throws InvalidArgument naming the parameter that is not float, bfloat16 or half, CPU and
  // contiguous with storage of its own, or that no unit claims.
  TorchEngine(Engine& engine, torch::nn::Module& model, TorchEngineOptions options = {});
  ~TorchEngine();
  TorchEngine(const TorchEngine&) = delete;
  TorchEngine& operator=(const TorchEngine&) = delete;

  // Collective: engine.finalize() (rank 0's values into every rank's parameters), then the hooks.
  // At stage 3 the parameters' own storage is released.
  void finalize();

  int num_units() const { return static_cast<int>(units_.size()); }
  const std::string& unit_name(int unit) const;
  // Throws InvalidArgument naming `name` and the units there are.
  int unit(std::string_view name) const;
  // Engine parameter ids in named_parameters() order, and their names.
  const std::vector<int>& ids() const { return ids_; }
  const std::string& param_name(size_t i) const { return params_[i].name; }

  // Runs `fn(inputs)` as unit `unit`'s forward (see the header comment). `inputs` are what flows in
  // from the rest of the graph; fn receives views of them, through which the unit must read them.
  torch::Tensor forward_unit(int unit, const std::vector<torch::Tensor>& inputs,
                             const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& fn);
  torch::Tensor forward_unit(int unit, const torch::Tensor& input,
                             const std::function<torch::Tensor(const torch::Tensor&)>& fn);
  // A Sequential whose children are units (each child's unit found by its module), child by child.
  torch::Tensor forward(torch::nn::Sequential& sequential, const torch::Tensor& input);

  // loss * engine.loss_scale(), backward through autograd, then finish_backward().
  void backward(const torch::Tensor& loss);
  // After the loop's own loss.backward(): closes the units' backward scopes still open and ends the
  // micro-step (engine.finish_backward()).
  void finish_backward();
  // Collective: engine.step() (finish_backward() first if a micro-step is open).
  StepResult step();

  // Collective: every parameter's full current values (cloned), in named_parameters() order, at any
  // stage (stage 3 gathers unit by unit). For checks and saving the module with torch::save.
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters();

 private:
  struct Param {
    std::string name;
    torch::Tensor tensor;
    int unit = 0;
    int id = -1;
    bool trainable = true;
    TpPlacement tp;
    std::shared_ptr<torch::autograd::Node> accumulator;  // kept alive: it carries the post hook
    uintptr_t post_hook = 0;
    unsigned pre_hook = 0;
    void* grad_ptr = nullptr;  // where .grad points in this micro-step, or null
  };
  struct Unit {
    std::string name;
    const torch::nn::Module* module = nullptr;  // null for a parameter name or the root's own unit
    std::vector<size_t> params;                 // indices into params_
    std::vector<UnitScope> forward;             // open forward scopes (innermost last)
    std::optional<UnitScope> backward;
    int pending_inputs = 0;  // input views whose gradient has not arrived in this backward
    int pending_params = 0;  // trainable parameters not accumulated in this backward
    bool opened = false;     // the backward scope was opened in this micro-step
  };

  void require_finalized(const char* what) const;
  void before_accumulate(size_t p);
  void after_accumulate(size_t p);
  void open_backward(int unit);
  void maybe_close_backward(int unit);
  void point_storage(int unit, UnitScope* scope);
  void reset_micro_step();

  Engine& engine_;
  torch::nn::Module& model_;
  TorchEngineOptions options_;
  std::vector<Param> params_;
  std::vector<Unit> units_;
  std::vector<int> ids_;
  bool finalized_ = false;
  bool sharded_params_ = false;  // stage 3: parameter storage points at gathered copies
};

}  // namespace zero::libtorch
