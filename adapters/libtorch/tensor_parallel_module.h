#pragma once
// What TorchEngine asks of a torch::nn module whose parameters lie on the tensor-parallel group in
// placements of their own (adapters/libtorch/tensor_parallel.h has the library's): it registers each
// of the module's parameters with the placement the module gives.
#include <string>

#include "comm/communicator.h"
#include "zero/tp_placement.h"

namespace zero::libtorch {

class TensorParallelModule {
 public:
  virtual ~TensorParallelModule() = default;
  // The placement of the parameter named `name` (as the module's named_parameters(recurse=false)
  // spells it: "weight", "bias"); InvalidArgument for a name it does not have.
  virtual TpPlacement tp_placement(const std::string& name) const = 0;
  virtual comm::Communicator& tp_group() const = 0;
};

}  // namespace zero::libtorch
