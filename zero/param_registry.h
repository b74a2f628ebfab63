#pragma once
// The parameters a training loop registers with the engine, their local validation, and the check
// that every rank registered the same names, shapes and dtypes in the same order.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "comm/communicator.h"
#include "memory/device.h"
#include "zero/tp_placement.h"

namespace zero {

// A view of user-owned storage: `numel` elements of the parameter's dtype at `ptr`.
struct StorageRef {
  void* ptr = nullptr;
  size_t numel = 0;
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;  // fp32, fp16 or bf16
  StorageRef data;                // the parameter values (required)
  StorageRef grad;                // optional gradient storage; empty = the engine provides it
  int unit = 0;                   // the unit (a layer or block) it belongs to; see Engine::gather
  int group = 0;                  // optimizer parameter group
  bool requires_grad = true;      // frozen parameters get no reduction and no optimizer state
  // How it lies on the tensor-parallel group: `shape` and the storage are this rank's part.
  // Replicated parameters count once in the global norm; partial_grad ones have their gradient
  // summed over tp (tensor parallelism's finalizer, parallel/tensor/tp_grads.h).
  TpPlacement tp;
  // A copy of a weight that another pipeline stage holds too (a tied embedding and output head):
  // the copies' gradients are summed over the tied group before the data-parallel reduction, their
  // values start as the tied group's rank 0's, and the global norm counts them there only (the tied
  // copies' finalizer, parallel/pipeline/tied_grads.h).
  bool tied = false;
  // Stage 3: this parameter's dtype in the engine (its shard, gathers, views and gradients), over
  // EngineOptions.param_dtype: fp32 keeps a LayerNorm in fp32 while the rest computes in bf16 (FSDP2's
  // per-module MixedPrecisionPolicy). The registered dtype, or fp16 or bf16 for an fp32 parameter.
  std::optional<DType> param_dtype;
};

// What about `p` needs a gradient finalizer (zero/grad_finalizer.h) to claim it ("split over tensor
// parallelism (ParamSpec.tp = split(0))", "tied (ParamSpec.tied)"); "" when nothing does.
std::string needs_finalizer(const ParamSpec& p);

size_t shape_numel(const std::vector<int64_t>& shape);  // throws InvalidArgument on overflow/<=0
std::string shape_string(const std::vector<int64_t>& shape);

class ParamRegistry {
 public:
  // Validates the spec locally. The first problem is remembered and raised by verify_across_ranks
  // (on every rank), so a bad registration on one rank cannot leave the others waiting.
  int add(const ParamSpec& spec);

  const std::vector<ParamSpec>& params() const { return params_; }
  const ParamSpec& param(int id) const;
  size_t numel(int id) const { return numels_.at(static_cast<size_t>(id)); }
  std::vector<int> trainable() const;
  std::optional<int> find(const std::string& name) const;
  // Unit ids in order of first registration, and the parameters of one unit (registration order).
  // Both are kept as parameters are added, not computed per call (scopes ask on every open and close).
  const std::vector<int>& units() const { return units_; }
  const std::vector<int>& params_of_unit(int unit) const;
  const std::string& local_error() const { return local_error_; }
  // Records a problem found outside add() (e.g. by the engine's option checks).
  void note_error(const std::string& message);

  // Collective (zero/rank_agreement.h): compares every rank's registration with rank 0's and throws
  // InvalidArgument on every rank naming the first difference and the ranks involved, or any rank's
  // local error.
  void verify_across_ranks(comm::Communicator& comm, std::chrono::milliseconds timeout,
                           memory::Device* device = nullptr) const;

  // One line per parameter: "name shape dtype requires_grad group unit".
  std::vector<std::string> signature_lines() const;

 private:
  std::vector<ParamSpec> params_;
  std::vector<size_t> numels_;
  std::unordered_map<std::string, int> by_name_;
  std::vector<int> units_;
  std::map<int, std::vector<int>> unit_params_;
  std::string local_error_;
};

}  // namespace zero
