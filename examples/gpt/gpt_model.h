#pragma once
// A GPT-2-style transformer with its forward and backward written by hand (Eigen for the matrix
// products), float32: token and learned position embeddings, pre-LayerNorm blocks with causal
// multi-head self-attention (fused qkv projection) and a tanh-GELU MLP, a final LayerNorm, the output
// head tied to the token embedding, mean cross-entropy. Parameter names, shapes and layout are
// GPT-2's (PyTorch's [out, in] linear weights, row-major): see tests/data/pytorch/README.md.
//
// Units, for the engine's scopes: 0 = the embeddings (wte, wpe), 1 + i = block i, n_layer + 1 = the
// final LayerNorm. The tied head reads wte after the final LayerNorm, so unit 0 is entered again for
// it in forward, and its backward scope stays open from the head's backward to the embeddings' (the
// gradient of wte has two parts and is complete only after both).
#include <Eigen/Dense>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zero::examples {

struct GptConfig {
  int vocab_size = 256;
  int block_size = 64;  // T, the longest context
  int n_embd = 64;
  int n_head = 4;
  int n_layer = 2;
};

class Gpt {
 public:
  // A parameter's name, shape, unit and initialization (normal with std_dev when > 0, else filled),
  // in the order the model registers them: what a planner needs without the values.
  struct ParamLayout {
    std::string name;
    std::vector<int64_t> shape;
    int unit = 0;
    bool decay = false;
    float std_dev = 0, fill = 0;
  };
  static std::vector<ParamLayout> layout(const GptConfig& config);

  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values;
    bool decay = false;  // matrices and embeddings decay; LayerNorm parameters and biases do not
    int unit = 0;
  };
  // Where parameters and gradients are while a unit runs (as examples::Mlp::Access): by default the
  // model's own storage and gradient buffers; an engine's loop opens unit scopes in enter/leave.
  struct Access {
    std::function<void(int unit, bool backward)> enter = [](int, bool) {};
    std::function<void(int unit, bool backward)> leave = [](int, bool) {};
    std::function<const float*(size_t param)> param;  // empty: params()[i].values
    std::function<float*(size_t param)> grad;         // where backward adds (+=) parameter i's gradient
  };

  // GPT-2's initialisation from `seed`: weights N(0, 0.02), the residual projections N(0, 0.02 /
  // sqrt(2 n_layer)), biases 0, LayerNorm 1 and 0.
  Gpt(const GptConfig& config, uint64_t seed);

  const GptConfig& config() const { return config_; }
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  size_t num_params() const;
  int num_units() const { return config_.n_layer + 2; }

  // Mean cross-entropy of predicting targets[b][t] from tokens[b][0..t]; `tokens` and `targets` are
  // B x T row-major, T <= block_size. Keeps the activations for backward.
  float forward(const std::vector<int>& tokens, const std::vector<int>& targets, int B, int T, const Access& access);
  // Gradients of the mean loss (times loss_scale), unit by unit from the head, added (+=) into
  // access.grad(i).
  void backward(float loss_scale, const Access& access);
  // The next-token logits at the last position of `context` (at most block_size tokens), no
  // activations kept: for sampling.
  std::vector<float> next_logits(const std::vector<int>& context, const Access& access);

 private:
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  struct LayerNormCache {
    Matrix xhat;
    Eigen::VectorXf rstd;
  };
  struct BlockCache {
    Matrix x_in, h1, qkv, att_y, x_mid, h2, fc, gelu;
    LayerNormCache ln1, ln2;
    std::vector<Matrix> probs;  // per (b, head): T x T
  };
  size_t p_wte() const { return 0; }
  size_t p_wpe() const { return 1; }
  size_t p_block(int layer, int k) const { return 2 + static_cast<size_t>(layer) * 12 + static_cast<size_t>(k); }
  size_t p_lnf(int k) const { return 2 + static_cast<size_t>(config_.n_layer) * 12 + static_cast<size_t>(k); }
  const float* value(const Access& a, size_t i) const { return a.param ? a.param(i) : params_[i].values.data(); }

  GptConfig config_;
  std::vector<Param> params_;
  // Activations of the last forward.
  int B_ = 0, T_ = 0;
  std::vector<int> tokens_, targets_;
  std::vector<BlockCache> blocks_;
  Matrix x_final, hf_, probs_out_;  // the last block's output, after ln_f, softmax(logits)
  LayerNormCache lnf_;
};

}  // namespace zero::examples
