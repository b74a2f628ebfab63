#pragma once
// A model of the tests' own, not the GPT: a residual MLP of `layers` blocks over `dim` features,
//
//   y = x + W2 relu(W1 x + b1) + b2        (W1 [hidden, dim], W2 [dim, hidden])
//
// with a mean squared error against targets after the last block. Forward and backward by hand,
// written as a user of the library writes a model: each block one engine unit, its matrices split
// over tp Megatron's way (W1 and b1 column-parallel, W2 row-parallel, b2 replicated) with the f and g
// operators of parallel/tensor, its backward split into the input part and the weight part for
// zero-bubble schedules. It knows nothing of pipelines beyond the layers it is given.
#include <any>
#include <cstddef>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/pipeline/pipeline_stage.h"
#include "zero/engine.h"

namespace zero::testing {

struct MlpShape {
  int dim = 8, hidden = 16, layers = 4;
};

// The full (unsplit) initial value of tensor t (0: W1, 1: b1, 2: W2, 3: b2) of layer l.
std::vector<float> mlp_initial(const MlpShape& s, int layer, int t);
// The data: sample i's input and target (dim values each).
std::vector<float> mlp_input(const MlpShape& s, int sample);
std::vector<float> mlp_target(const MlpShape& s, int sample);

class ResidualMlp {
 public:
  // This rank's part of the layers [first, end) over `tp`, registered with `engine` (unit = layer).
  ResidualMlp(const MlpShape& shape, comm::Communicator& tp, Engine& engine, parallel::LayerRange layers);

  // The stage functions over these layers; `sample0`: this data-parallel rank's first sample.
  float forward(const parallel::StageCall& call, const parallel::StageTensor& input, parallel::StageTensor& output,
                int sample0);
  void backward(const parallel::StageCall& call, const parallel::StageTensor& grad_output,
                parallel::StageTensor& grad_input);
  void weight(const parallel::StageCall& call);
  parallel::LayerRange layers() const { return layers_; }

  // Tensor t of layer l as the engine holds it now (this rank's tp part), and the same part of a
  // full tensor.
  std::vector<float> param(int layer, int t);
  std::vector<float> part_of(int t, const std::vector<float>& full) const;

 private:
  struct Saved;  // what a micro-batch's backward needs, kept in its StageCall::context
  void block_input_grad(UnitScope& scope, Saved& s, int l, std::vector<float>& dy);
  void block_weight_grad(UnitScope& scope, const Saved& s, int l);
  std::vector<int64_t> local_shape(int t) const;

  MlpShape shape_;
  comm::Communicator& tp_;
  int tp_rank_ = 0, tp_size_ = 1;  // kept: part_of() is asked after the mesh is gone
  Engine& engine_;
  parallel::LayerRange layers_;
  int h_ = 0;  // this rank's hidden width
  std::vector<std::vector<float>> values_;  // per (layer - first) * 4 + t
  std::vector<int> ids_;
};

}  // namespace zero::testing
