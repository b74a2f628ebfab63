#include "parallel/strategy/gpt2.h"

#include <fmt/format.h>

#include <cstdlib>
#include <sstream>
#include <vector>

#include "base/check.h"

namespace zero::strategy {

Gpt2Shape parse_gpt2_shape(const std::string& text, const std::string& flag) {
  std::vector<int> v;
  std::stringstream parts(text);
  for (std::string p; std::getline(parts, p, ',');) {
    char* end = nullptr;
    const long x = std::strtol(p.c_str(), &end, 10);
    if (p.empty() || *end != '\0' || x < 1 || x > 1 << 24) {
      ZERO_THROW(InvalidArgument, "{} '{}': '{}' is not a positive integer", flag, text, p);
    }
    v.push_back(static_cast<int>(x));
  }
  if (v.size() != 3 && v.size() != 5) {
    ZERO_THROW(InvalidArgument, "{} '{}': expected n_layer,n_embd,n_head[,vocab_size,block_size]", flag, text);
  }
  Gpt2Shape s;
  s.n_layer = v[0];
  s.n_embd = v[1];
  s.n_head = v[2];
  if (v.size() == 5) {
    s.vocab_size = v[3];
    s.block_size = v[4];
  }
  if (s.n_embd % s.n_head != 0) {
    ZERO_THROW(InvalidArgument, "{} '{}': n_head {} does not divide n_embd {}", flag, text, s.n_head, s.n_embd);
  }
  return s;
}

std::string gpt2_shape_text(const Gpt2Shape& s) {
  return fmt::format("{},{},{},{},{}", s.n_layer, s.n_embd, s.n_head, s.vocab_size, s.block_size);
}

ModelDescription describe_gpt2(const Gpt2Shape& s, bool fp32_norms) {
  using Split = ActivationTerm::Split;
  using When = ActivationTerm::When;
  const int64_t C = s.n_embd, V = s.vocab_size, T = s.block_size;
  const double f = 4.0;  // bytes of an fp32 activation
  ModelDescription m;
  m.name = fmt::format("GPT {} layers, n_embd {}, {} heads, vocabulary {}, context {}", s.n_layer, s.n_embd, s.n_head,
                       s.vocab_size, s.block_size);
  m.kernels = "gpt/" + gpt2_shape_text(s);
  m.sequence_length = s.block_size;
  m.hidden = s.n_embd;
  m.heads = m.kv_heads = s.n_head;
  m.blocks = s.n_layer;
  m.activation_dtype = DType::kFloat32;
  auto tensor = [&](std::string name, std::vector<int64_t> shape, TpPlacement tp = {}, bool no_decay = false) {
    DescribedTensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.tp = tp;
    t.no_decay = no_decay;
    if (no_decay && fp32_norms) t.dtype = DType::kFloat32;
    return t;
  };
  auto norm = [&](const std::string& name) { return tensor(name, {C}, {}, true); };
  auto token = [](double bytes, Split split = Split::kNone, When when = When::kAny) {
    return ActivationTerm{ActivationTerm::Per::kToken, bytes, split, when};
  };

  // The embedding: the vocabulary-parallel token table and the positions. Its weight part keeps
  // wpe's gradient (the rows this rank holds) and, under tp, the whole stream's for the table.
  DescribedTensor wte = tensor("wte.weight", {V, C}, TpPlacement::split(0));
  wte.vocab = true;
  m.embedding.tensors = {wte, tensor("wpe.weight", {T, C})};
  m.embedding.forward = m.embedding.backward_input = m.embedding.backward_weight = 0.0;  // lookups
  m.embedding.leave = 1;
  m.embedding.weight_work = {token(f * C, Split::kSequence), token(f * C, Split::kNone, When::kAboveTp1)};

  // A block: attention and the MLP, each a tp region entered and left.
  const TpPlacement column = TpPlacement::split(0), row = TpPlacement::split(1), qkv = TpPlacement::split(0, 3);
  m.block.tensors = {norm("ln_1.weight"),
                     norm("ln_1.bias"),
                     tensor("attn.c_attn.weight", {3 * C, C}, qkv),
                     tensor("attn.c_attn.bias", {3 * C}, qkv, true),
                     tensor("attn.c_proj.weight", {C, C}, row),
                     tensor("attn.c_proj.bias", {C}, {}, true),
                     norm("ln_2.weight"),
                     norm("ln_2.bias"),
                     tensor("mlp.c_fc.weight", {4 * C, C}, column),
                     tensor("mlp.c_fc.bias", {4 * C}, column, true),
                     tensor("mlp.c_proj.weight", {C, 4 * C}, row),
                     tensor("mlp.c_proj.bias", {C}, {}, true)};
  // Per token: the four matrices' 24 C^2 each pass; attention's scores and weighted sum 4 T C
  // forward, twice that in the input part (dq, dk, dv, the probabilities' gradient).
  const double linear = 24.0 * C * C, attention = 4.0 * T * C;
  m.block.forward = linear + attention;
  m.block.backward_input = linear + 2 * attention;
  m.block.backward_weight = linear;
  m.block.enter = m.block.leave = 2;
  // Held: the two LayerNorms' normalized inputs (the rows this rank holds), the two regions'
  // gathered inputs, this rank's q|k|v, attention output, MLP product and its GELU, and the
  // attention probabilities of its heads (T per token and head).
  m.block.activations = {token(2 * f * C, Split::kSequence), token(2 * f * C),
                         token(f * (12.0 * C + static_cast<double>(s.n_head) * T), Split::kTp)};
  // A split backward's weight part reads the four linear layers' inputs (h1 and h2 gathered, this
  // rank's attention output and GELU); its input part adds the row-parallel biases' and the
  // LayerNorms' column sums (six rows of C), the row-parallel weights' gathered output gradients,
  // c_fc's and c_attn's output gradients.
  m.block.weight_reads = std::vector<ActivationTerm>{token(2 * f * C), token(f * 5.0 * C, Split::kTp)};
  m.block.weight_work = {ActivationTerm{ActivationTerm::Per::kMicroBatch, 6 * f * C}, token(2 * f * C),
                         token(f * 7.0 * C, Split::kTp)};

  // The head: the final LayerNorm, the tied output layer and a vocabulary-parallel loss (three sums
  // of one float per token: the maximum, the exponentials, the target logits).
  DescribedTensor head = tensor("lm_head.weight", {V, C}, TpPlacement::split(0));
  head.vocab = true;
  head.tied_to = "wte.weight";
  head.dtype.reset();  // a tied tensor takes the embedding's dtype
  m.head.tensors = {norm("ln_f.weight"), norm("ln_f.bias"), head};
  m.head.enter = 1;
  m.head.all_reduces_per_token = {f, f, f};
  // Held: ln_f's normalized input (held rows), its output (gathered), and at tp 1 the whole
  // vocabulary's probabilities; the weight part reads ln_f's output and keeps the logits' gradients
  // and ln_f's two column sums.
  m.head.activations = {token(f * C, Split::kSequence), token(f * C), token(f * V, Split::kNone, When::kTp1)};
  m.head.weight_reads = std::vector<ActivationTerm>{token(f * C)};
  m.head.weight_work = {token(f * V, Split::kVocab), ActivationTerm{ActivationTerm::Per::kMicroBatch, 2 * f * C}};
  return m;
}

EngineOptions gpt2_engine_options(float lr) {
  EngineOptions o;
  o.optimizer.kind = optim::OptimizerKind::kAdamW;
  const optim::Hyper decayed{.lr = lr, .weight_decay = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f};
  optim::Hyper plain = decayed;
  plain.weight_decay = 0.0f;
  o.optimizer.groups = {decayed, plain};
  o.max_grad_norm = 1.0f;
  return o;
}

}  // namespace zero::strategy
