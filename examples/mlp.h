#pragma once
// A small multi-layer perceptron with hand-written forward and backward passes (Eigen), the model the
// examples train. Parameters live in the model (the user's storage); gradients go wherever the caller
// points them (the engine's gradient storage), accumulated with +=.
#include <Eigen/Dense>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zero::examples {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<Matrix>;
using Vector = Eigen::Matrix<float, 1, Eigen::Dynamic>;
using VectorMap = Eigen::Map<Vector>;

class Mlp {
 public:
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values;
    bool decay = true;  // matrices decay, biases do not
  };

  // Layers in -> hidden... -> out, initialised with Kaiming-uniform weights from `seed`.
  Mlp(const std::vector<int>& widths, uint64_t seed);

  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  size_t num_layers() const { return params_.size() / 2; }
  size_t num_params() const;

  // Where a layer's parameters are while it runs. By default the model's own storage; a sharded
  // loop (stage 3) opens the layer's gather scope in `enter` and closes it in `leave`, and `param(i)`
  // returns the gathered values of parameter i.
  struct Access {
    std::function<void(size_t layer, bool backward)> enter = [](size_t, bool) {};
    std::function<void(size_t layer, bool backward)> leave = [](size_t, bool) {};
    std::function<const float*(size_t param)> param;  // empty: params()[i].values
  };

  // Mean softmax cross-entropy of the batch; keeps the activations for backward.
  float forward(const Matrix& x, const std::vector<int>& labels, const Access& access);
  float forward(const Matrix& x, const std::vector<int>& labels) { return forward(x, labels, Access{}); }
  // Gradient of the mean loss (times loss_scale), layer by layer from the last. For parameter i it
  // calls grad(i) for the destination (+=), then ready(i) once that gradient is complete.
  void backward(float loss_scale, const std::function<float*(size_t)>& grad,
                const std::function<void(size_t)>& ready, const Access& access);
  void backward(float loss_scale, const std::function<float*(size_t)>& grad,
                const std::function<void(size_t)>& ready) {
    backward(loss_scale, grad, ready, Access{});
  }

 private:
  const float* value(const Access& access, size_t i) const {
    return access.param ? access.param(i) : params_[i].values.data();
  }
  std::vector<Param> params_;  // W0, b0, W1, b1, ...
  std::vector<Matrix> acts_;   // inputs of each layer (post-activation)
  std::vector<Matrix> pre_;    // pre-activations of each hidden layer
  Matrix probs_;
  std::vector<int> labels_;
};

// Deterministic synthetic classification data: sample s of step t is the same on every rank and at
// every world size. Labels come from a fixed random teacher network, so the task is learnable.
class SyntheticData {
 public:
  SyntheticData(int inputs, int classes, uint64_t seed);
  // Samples [first, first + count) of step `step`.
  void batch(int64_t step, int64_t first, int count, Matrix* x, std::vector<int>* labels) const;

 private:
  int inputs_;  // the classes are the teacher's columns
  uint64_t seed_;
  Matrix teacher_;
};

}  // namespace zero::examples
