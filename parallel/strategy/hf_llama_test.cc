#include "parallel/strategy/hf_llama.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/error.h"

namespace zero::strategy {
namespace {

// meta-llama/Llama-2-7b-hf's config.json as published.
const char* kLlama2_7b = R"({"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
  "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.31.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

// The two descriptions' fields, their names aside.
std::string fields(ModelDescription m) {
  m.name.clear();
  return to_json(m);
}

std::string error_of(const std::string& text) {
  try {
    describe_llama(text, "config.json");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

std::string with(const std::string& from, const std::string& to) {
  std::string s = kLlama2_7b;
  const size_t at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

TEST_CASE("LLaMA-2's HuggingFace configs give the descriptions examples/models holds") {
  const ModelDescription seven = describe_llama(kLlama2_7b, "config.json");
  CHECK(seven.sequence_length == 4096);
  CHECK(seven.name == "llama (32 layers, hidden 4096, 32 heads, from config.json)");
  CHECK(fields(seven) == fields(load_model_description("examples/models/llama2_7b.json")));
  const ModelDescription seventy =
      describe_llama(R"({"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
                         "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80,
                         "vocab_size": 32000, "max_position_embeddings": 4096})",
                     "70b/config.json");
  CHECK(fields(seventy) == fields(load_model_description("examples/models/llama2_70b.json")));
  // The files written back read the same.
  for (const ModelDescription& m : {seven, seventy}) CHECK(to_json(parse_model_description(to_json(m), "m")) == to_json(m));
}

TEST_CASE("Mistral 7B: 7.24 billion parameters, grouped-query attention, the sequence length given") {
  const DescribedModel m(describe_llama(R"({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                                            "num_attention_heads": 32, "num_key_value_heads": 8,
                                            "num_hidden_layers": 32, "vocab_size": 32000,
                                            "max_position_embeddings": 32768, "sliding_window": 4096})",
                                        "config.json", 8192),
                         DType::kBFloat16);
  CHECK(m.sequence_length() == 8192);
  CHECK(m.stage({}, 0, 1, Cluster{}).engine->numel() == 7241732096ull);
  CHECK(m.unsupported({.tp = 16}, 8) == "tp 16 does not divide the 8 key and value heads");
}

TEST_CASE("a tied config ties the output layer; what is not LLaMA's shape is refused by name") {
  const ModelDescription tied = describe_llama(with(R"("tie_word_embeddings": false)", R"("tie_word_embeddings": true)"),
                                               "config.json");
  CHECK(tied.head.tensors.back().tied_to == "tok_embeddings.weight");
  CHECK(DescribedModel(tied, DType::kBFloat16).stage({}, 0, 1, Cluster{}).engine->numel() == 6738415616ull - 131072000);
  CHECK(error_of(with(R"("model_type": "llama")", R"("model_type": "gpt2")")).find("model_type \"gpt2\"") !=
        std::string::npos);
  CHECK(error_of(with(R"("hidden_size": 4096, )", "")) == "config.json: missing field hidden_size");
  CHECK(error_of(with(R"("num_key_value_heads": 32)", R"("num_key_value_heads": 5)")) ==
        "config.json: num_key_value_heads 5 does not divide num_attention_heads 32");
  CHECK(error_of(with(R"("vocab_size": 32000)", R"("vocab_size": "32000")")).find("vocab_size") != std::string::npos);
}

TEST_CASE("Gemma 7B: 8.54 billion parameters, its output tied by default, heads wider than hidden / heads") {
  // google/gemma-7b's config.json (it leaves tie_word_embeddings out: Gemma ties by default).
  const std::string gemma = R"({"architectures": ["GemmaForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 2, "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 24576, "max_position_embeddings": 8192,
    "model_type": "gemma", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 16,
    "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 10000.0,
    "torch_dtype": "bfloat16", "transformers_version": "4.38.0.dev0", "use_cache": true, "vocab_size": 256000})";
  const ModelDescription m = describe_llama(gemma, "config.json", 4096);
  CHECK(m.head.tensors.back().tied_to == "tok_embeddings.weight");
  CHECK(m.block.tensors[1].shape == std::vector<int64_t>{16 * 256, 3072});  // q: 4096 wide from 3072
  CHECK(DescribedModel(m, DType::kBFloat16).stage({}, 0, 1, Cluster{}).engine->numel() == 8537680896ull);
  // Told otherwise, it is untied.
  std::string untied = gemma;
  untied.replace(untied.find(R"("use_cache": true)"), 17, R"("tie_word_embeddings": false)");
  CHECK(describe_llama(untied, "config.json", 4096).head.tensors.back().tied_to.empty());
}

TEST_CASE("Qwen2's q, k and v biases, and LLaMA's attention_bias and mlp_bias, are tensors of their own") {
  // Qwen/Qwen2-7B's config.json: 7,615,616,512 parameters, as its model card gives (7.62 B).
  const ModelDescription qwen = describe_llama(
      R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
          "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
          "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
          "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
          "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
          "torch_dtype": "bfloat16", "transformers_version": "4.37.2", "use_cache": true,
          "use_sliding_window": false, "vocab_size": 152064})",
      "config.json", 4096);
  CHECK(fields(qwen) == fields(load_model_description("examples/models/qwen2_7b.json")));
  const DescribedModel q(qwen, DType::kBFloat16);
  CHECK(q.stage({}, 0, 1, Cluster{}).engine->numel() == 7615616512ull);
  // Split with their projections' outputs: tp 4 holds a quarter of each (q 3584, k and v 512 wide).
  const auto at_tp4 = q.stage({.tp = 4}, 0, 4, Cluster{}).engine;
  uint64_t biases = 0;
  for (const plan::TensorSpec& t : at_tp4->tensors) {
    if (t.name.find(".bias") != std::string::npos) {
      CHECK(t.group == 1);  // no weight decay
      biases += static_cast<uint64_t>(t.shape.at(0));
    }
  }
  CHECK(biases == 28 * (3584 + 2 * 512) / 4);
  // LLaMA's flags: four attention biases (the output's whole beside its row-parallel weight), three MLP ones.
  const ModelDescription biased =
      describe_llama(with(R"("use_cache": true)", R"("attention_bias": true, "mlp_bias": true)"), "config.json");
  CHECK(DescribedModel(biased, DType::kBFloat16).stage({}, 0, 1, Cluster{}).engine->numel() ==
        6738415616ull + 32ull * (4 * 4096 + 2 * 11008 + 4096));
  const auto biased_tp2 = DescribedModel(biased, DType::kBFloat16).stage({.tp = 2}, 0, 2, Cluster{}).engine;
  for (const plan::TensorSpec& t : biased_tp2->tensors) {
    if (t.name == "blocks.0.attention.wo.bias") CHECK(t.shape.at(0) == 4096);
    if (t.name == "blocks.0.feed_forward.w1.bias") CHECK(t.shape.at(0) == 11008 / 2);
  }
  CHECK(error_of(with(R"("use_cache": true)", R"("mlp_bias": "yes")")).find("mlp_bias") != std::string::npos);
}

}  // namespace
}  // namespace zero::strategy
