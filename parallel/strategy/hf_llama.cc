#include "parallel/strategy/hf_llama.h"

#include <fmt/format.h>

#include <filesystem>

#include "zero/config/json_reading.h"

namespace zero::strategy {
namespace {

using config_internal::Context;
using config_internal::fail;
using config_internal::json;
using config_internal::ObjectReader;
using config_internal::require;

int positive_int(ObjectReader& r, const std::string& key) {
  return config_internal::read_int(require(r, key), key, r.ctx(), 1);
}

// HuggingFace writes null for a field left to its default.
const json* given(ObjectReader& r, const std::string& key) {
  const json* j = r.find(key);
  return j != nullptr && !j->is_null() ? j : nullptr;
}

ActivationTerm per_token(double bytes, ActivationTerm::Split split = ActivationTerm::Split::kNone,
                         ActivationTerm::When when = ActivationTerm::When::kAny) {
  return {ActivationTerm::Per::kToken, bytes, split, when};
}

DescribedTensor tensor(std::string name, std::vector<int64_t> shape, TpPlacement tp = {}, bool no_decay = false) {
  DescribedTensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.tp = tp;
  t.no_decay = no_decay;
  return t;
}

}  // namespace

ModelDescription describe_llama(std::string_view text, const std::string& source, int sequence_length) {
  const Context ctx{source};
  const json root = config_internal::parse_json(text, source);
  if (!root.is_object()) fail(ctx, "a HuggingFace config is a JSON object");
  ObjectReader r(root, "", ctx);
  const std::string type = config_internal::read_string(require(r, "model_type"), "model_type", ctx, "a string");
  if (type != "llama" && type != "mistral" && type != "qwen2" && type != "gemma") {
    fail(ctx, fmt::format("model_type \"{}\": only LLaMA-family configs (llama, mistral, qwen2, gemma) are "
                          "described; write a model description for others (parallel/strategy/described_model.h)",
                          type));
  }
  const int64_t h = positive_int(r, "hidden_size"), f = positive_int(r, "intermediate_size");
  const int heads = positive_int(r, "num_attention_heads"), blocks = positive_int(r, "num_hidden_layers");
  const int64_t V = positive_int(r, "vocab_size");
  const int kv = given(r, "num_key_value_heads") ? positive_int(r, "num_key_value_heads") : heads;
  if (heads % kv != 0) fail(ctx, fmt::format("num_key_value_heads {} does not divide num_attention_heads {}", kv, heads));
  if (!given(r, "head_dim") && h % heads != 0) {
    fail(ctx, fmt::format("num_attention_heads {} does not divide hidden_size {}", heads, h));
  }
  const int64_t d = given(r, "head_dim") ? positive_int(r, "head_dim") : h / heads;
  // Gemma ties its output layer to the embedding unless told otherwise (its config usually leaves the
  // key out); the others do not.
  const json* tie = given(r, "tie_word_embeddings");
  const bool tied = tie != nullptr ? config_internal::read_bool(*tie, "tie_word_embeddings", ctx) : type == "gemma";
  auto flag = [&](const char* key) { return given(r, key) && config_internal::read_bool(*given(r, key), key, ctx); };
  // Qwen2's q, k and v projections always have biases (its config has no key for them); LLaMA's
  // attention_bias puts them on all four, mlp_bias on the MLP's three.
  const bool qkv_bias = type == "qwen2" || flag("attention_bias"), out_bias = flag("attention_bias");
  const bool mlp_bias = flag("mlp_bias");
  const int T = sequence_length > 0 ? sequence_length : positive_int(r, "max_position_embeddings");

  const int64_t q = heads * d, k = kv * d;  // the query and the key/value widths
  const double b16 = 2;                     // bytes of a bf16 activation
  using Split = ActivationTerm::Split;
  ModelDescription m;
  m.name = fmt::format("{} ({} layers, hidden {}, {} heads{}, from {})", type, blocks, h, heads,
                       kv != heads ? fmt::format(", {} key and value heads", kv) : "",
                       std::filesystem::path(source).filename().string());
  m.sequence_length = T;
  m.hidden = static_cast<int>(h);
  m.heads = heads;
  m.kv_heads = kv;
  m.blocks = blocks;
  m.activation_dtype = DType::kBFloat16;

  DescribedTensor wte = tensor("tok_embeddings.weight", {V, h}, TpPlacement::split(0));
  wte.vocab = true;
  m.embedding.tensors = {wte};
  m.embedding.forward = m.embedding.backward_input = m.embedding.backward_weight = 0.0;
  m.embedding.leave = 1;
  m.embedding.weight_work = {per_token(h * b16, Split::kNone, ActivationTerm::When::kAboveTp1)};

  const TpPlacement column = TpPlacement::split(0), row = TpPlacement::split(1);
  // A projection's weight and, where the config gives it one, its bias (no weight decay): split with
  // a column-parallel layer's outputs, whole beside a row-parallel one (added after its all-reduce,
  // so under sequence parallelism its gradient is a partial sum, as a norm's).
  std::vector<DescribedTensor>& block = m.block.tensors;
  auto projection = [&](const std::string& name, int64_t out, int64_t in, bool split_rows, bool bias) {
    block.push_back(tensor(name + ".weight", {out, in}, split_rows ? row : column));
    if (bias) block.push_back(tensor(name + ".bias", {out}, split_rows ? TpPlacement() : column, true));
  };
  block.push_back(tensor("attention_norm.weight", {h}, {}, true));
  projection("attention.wq", q, h, false, qkv_bias);
  projection("attention.wk", k, h, false, qkv_bias);
  projection("attention.wv", k, h, false, qkv_bias);
  projection("attention.wo", h, q, true, out_bias);
  block.push_back(tensor("ffn_norm.weight", {h}, {}, true));
  projection("feed_forward.w1", f, h, false, mlp_bias);
  projection("feed_forward.w3", f, h, false, mlp_bias);
  projection("feed_forward.w2", h, f, true, mlp_bias);
  const double linear = 2.0 * static_cast<double>(2 * q * h + 2 * k * h + 3 * h * f);
  const double attention = 4.0 * T * static_cast<double>(q);
  m.block.forward = linear + attention;
  m.block.backward_input = linear + 2 * attention;
  m.block.backward_weight = linear;
  m.block.enter = m.block.leave = 2;
  m.block.activations = {per_token(2 * h * b16, Split::kSequence), per_token(2 * h * b16),
                         per_token(static_cast<double>(2 * q + 2 * k + 3 * f) * b16 + 4.0 * heads, Split::kTp)};
  // A split backward's weight part reads the projections' inputs (the two regions' gathered inputs,
  // the attention output into wo, the SwiGLU product into w2); its input part adds their output
  // gradients (wo's and w2's gathered) and the two RMSNorms' column sums (fp32).
  m.block.weight_reads = std::vector<ActivationTerm>{per_token(2 * h * b16),
                                                     per_token(static_cast<double>(q + f) * b16, Split::kTp)};
  m.block.weight_work = {per_token(2 * h * b16), per_token(static_cast<double>(q + 2 * k + 2 * f) * b16, Split::kTp),
                         ActivationTerm{ActivationTerm::Per::kMicroBatch, 2.0 * h * 4}};

  DescribedTensor out = tensor("output.weight", {V, h}, TpPlacement::split(0));
  out.vocab = true;
  if (tied) out.tied_to = wte.name;
  m.head.tensors = {tensor("norm.weight", {h}, {}, true), out};
  m.head.enter = 1;
  m.head.all_reduces_per_token = {4, 4, 4};  // the vocabulary-parallel loss: maximum, sum, target logit
  m.head.activations = {per_token(h * b16, Split::kSequence), per_token(h * b16), per_token(4.0 * V, Split::kVocab)};
  m.head.weight_reads = std::vector<ActivationTerm>{per_token(h * b16)};  // the output layer's input
  m.head.weight_work = {per_token(V * b16, Split::kVocab), ActivationTerm{ActivationTerm::Per::kMicroBatch, h * 4.0}};
  return m;
}

ModelDescription load_llama_description(const std::string& path, int sequence_length) {
  return describe_llama(config_internal::read_text_file(path, "HuggingFace config"), path, sequence_length);
}

}  // namespace zero::strategy
