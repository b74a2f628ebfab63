#include "zero/config/engine_config.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"

namespace zero {
namespace {

using json = nlohmann::json;

EngineConfig ds(const std::string& text) { return parse_deepspeed_config(text, "ds.json"); }
EngineConfig ours(const std::string& text) { return parse_native_config(text, "ours.json"); }

// The message of the InvalidArgument `parse` throws ("no error" when it throws none).
std::string error_of(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}
std::string ds_error(const std::string& text) {
  return error_of([&] { ds(text); });
}
std::string our_error(const std::string& text) {
  return error_of([&] { ours(text); });
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Every option as "path" -> value text, from our format's writer: "optimizer.groups[0].lr" -> "0.001".
void flatten(const json& j, const std::string& path, std::map<std::string, std::string>& out) {
  if (j.is_object()) {
    for (const auto& item : j.items()) flatten(item.value(), path.empty() ? item.key() : path + "." + item.key(), out);
  } else if (j.is_array() && !j.empty() && j[0].is_object()) {  // a list of sections; a list of values is one value
    for (size_t i = 0; i < j.size(); ++i) flatten(j[i], path + "[" + std::to_string(i) + "]", out);
  } else {
    out[path] = j.dump();
  }
}
std::map<std::string, std::string> flat(const EngineConfig& c) {
  std::map<std::string, std::string> out;
  flatten(json::parse(to_native_json(c)), "", out);
  return out;
}

// The option paths whose values differ between two configs (a key present in one only counts).
std::set<std::string> changed(const EngineConfig& base, const EngineConfig& c) {
  const auto a = flat(base), b = flat(c);
  std::set<std::string> keys;
  for (const auto& [k, v] : a) {
    if (!b.count(k) || b.at(k) != v) keys.insert(k);
  }
  for (const auto& [k, v] : b) {
    if (!a.count(k)) keys.insert(k);
  }
  return keys;
}
std::string value_of(const EngineConfig& c, const std::string& path) {
  const auto f = flat(c);
  return f.count(path) ? f.at(path) : "(absent)";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path << " (cwd " << std::filesystem::current_path() << ")");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// DeepSpeed keys, one at a time: each changes exactly the option it maps to.

struct MappingCase {
  const char* name;
  std::string base;                           // DeepSpeed config the case is compared against
  std::string json;                           // the same with the key set
  std::map<std::string, std::string> expect;  // every option that changes, with its new value
};

TEST_CASE("each DeepSpeed key changes exactly the option it maps to") {
  const std::string zero = R"({"zero_optimization": {}})";
  const std::string fp16 = R"({"fp16": {"enabled": true}})";
  const std::string adam = R"({"optimizer": {"type": "AdamW"}})";
  const std::vector<MappingCase> cases{
      {"zero_optimization.stage", zero, R"({"zero_optimization": {"stage": 3}})", {{"stage", "3"}}},
      {"offload_optimizer.device cpu",
       zero,
       R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})",
       {{"offload.optimizer", "true"}}},
      {"cpu_offload (DeepSpeed's deprecated form)",
       zero,
       R"({"zero_optimization": {"cpu_offload": true}})",
       {{"offload.optimizer", "true"}}},
      {"DeepSpeed_Adam (DeepSpeed's CPU Adam)", adam, R"({"optimizer": {"type": "DeepSpeed_Adam"}})", {}},
      {"offload_optimizer.device none",
       zero,
       R"({"zero_optimization": {"offload_optimizer": {"device": "none"}}})",
       {}},
      {"offload_optimizer.pin_memory",
       zero,
       R"({"zero_optimization": {"offload_optimizer": {"device": "none", "pin_memory": false}}})",
       {{"offload.pinned_staging", "false"}}},
      {"offload_param.device cpu",
       R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})",
       R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
           "offload_param": {"device": "cpu"}}})",
       {{"offload.params", "true"}}},
      {"zero_quantized_weights (ZeRO++ qwZ: int8 blocks of 256, both passes)",
       R"({"zero_optimization": {"stage": 3}})",
       R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true}})",
       {{"quantized_weights.bits", "8"}}},
      {"zero_quantized_gradients (ZeRO++ qgZ: int4 blocks of 256)",
       R"({"zero_optimization": {"stage": 3}})",
       R"({"zero_optimization": {"stage": 3, "zero_quantized_gradients": true}})",
       {{"quantized_gradients.bits", "4"}}},
      {"zero_hpz_partition_size (ZeRO++ hpZ within groups of that many ranks)",
       R"({"zero_optimization": {"stage": 3}})",
       R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}})",
       {{"node_size", "8"}, {"secondary_shard", "true"}}},
      {"offload_param.pin_memory",
       R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})",
       R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
           "offload_param": {"device": "none", "pin_memory": false}}})",
       {{"offload.pinned_staging", "false"}}},
      {"reduce_bucket_size",
       zero,
       R"({"zero_optimization": {"reduce_bucket_size": 1000}})",
       {{"layout.bucket_numel", "1000"}}},
      {"allgather_bucket_size",
       zero,
       R"({"zero_optimization": {"allgather_bucket_size": 2e3}})",
       {{"layout.bucket_numel", "2000"}}},
      {"both bucket sizes, equal",
       zero,
       R"({"zero_optimization": {"allgather_bucket_size": 3000, "reduce_bucket_size": 3000}})",
       {{"layout.bucket_numel", "3000"}}},
      {"stage3_prefetch_bucket_size (fp32: 4 bytes per element)",
       zero,
       R"({"zero_optimization": {"stage3_prefetch_bucket_size": 1e6}})",
       {{"prefetch_bytes", "4000000"}}},
      {"stage3_prefetch_bucket_size (bf16: 2 bytes per element)",
       R"({"bf16": {"enabled": true}})",
       R"({"bf16": {"enabled": true}, "zero_optimization": {"stage3_prefetch_bucket_size": 1e6}})",
       {{"prefetch_bytes", "2000000"}}},
      {"stage3_param_persistence_threshold (fp16)",
       fp16,
       R"({"fp16": {"enabled": true}, "zero_optimization": {"stage3_param_persistence_threshold": 1e4}})",
       {{"param_persistence_bytes", "20000"}}},
      {"stage3_max_live_parameters",
       zero,
       R"({"zero_optimization": {"stage3_max_live_parameters": 1e8}})",
       {{"max_live_gathered_bytes", "400000000"}}},
      {"overlap_comm, contiguous_gradients, reduce_scatter, allgather_partitions: true",
       zero,
       R"({"zero_optimization": {"overlap_comm": true, "contiguous_gradients": true, "reduce_scatter": true,
           "allgather_partitions": true}})",
       {}},
      {"gradient_accumulation_steps",
       zero,
       R"({"zero_optimization": {}, "gradient_accumulation_steps": 4})",
       {{"micro_batches", "4"}}},
      {"gradient_clipping", zero, R"({"gradient_clipping": 0.5})", {{"max_grad_norm", "0.5"}}},
      {"fp16.enabled (dynamic scaling with DeepSpeed's window)",
       zero,
       fp16,
       {{"model_dtype", "\"fp16\""}, {"loss_scaling", "\"dynamic\""}, {"dynamic_loss_scaler.growth_interval", "1000"}}},
      {"fp16.enabled = false", zero, R"({"fp16": {"enabled": false}})", {}},
      {"fp16.loss_scale 0 (dynamic)", fp16, R"({"fp16": {"enabled": true, "loss_scale": 0}})", {}},
      {"fp16.loss_scale > 0 (static)",
       zero,
       R"({"fp16": {"enabled": true, "loss_scale": 128}})",
       {{"model_dtype", "\"fp16\""}, {"loss_scaling", "\"static\""}, {"static_loss_scale", "128.0"}}},
      {"fp16.initial_scale_power",
       fp16,
       R"({"fp16": {"enabled": true, "initial_scale_power": 10}})",
       {{"dynamic_loss_scaler.initial_scale", "1024.0"}}},
      {"fp16.loss_scale_window",
       fp16,
       R"({"fp16": {"enabled": true, "loss_scale_window": 500}})",
       {{"dynamic_loss_scaler.growth_interval", "500"}}},
      {"fp16.hysteresis",
       fp16,
       R"({"fp16": {"enabled": true, "hysteresis": 4}})",
       {{"dynamic_loss_scaler.hysteresis", "4"}}},
      {"fp16.consecutive_hysteresis",
       fp16,
       R"({"fp16": {"enabled": true, "consecutive_hysteresis": true}})",
       {{"dynamic_loss_scaler.consecutive_hysteresis", "true"}}},
      {"fp16.min_loss_scale",
       fp16,
       R"({"fp16": {"enabled": true, "min_loss_scale": 0.25}})",
       {{"dynamic_loss_scaler.min_scale", "0.25"}}},
      {"fp16.auto_cast false", fp16, R"({"fp16": {"enabled": true, "auto_cast": false}})", {}},
      {"bf16.enabled", zero, R"({"bf16": {"enabled": true}})", {{"model_dtype", "\"bf16\""}}},
      {"optimizer Adam (adam_w_mode defaults to true: AdamW)", adam, R"({"optimizer": {"type": "Adam"}})", {}},
      {"optimizer adam_w_mode false",
       adam,
       R"({"optimizer": {"type": "adam", "adam_w_mode": false}})",
       {{"optimizer.kind", "\"adam\""}}},
      {"optimizer params.adam_w_mode false",
       adam,
       R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})",
       {{"optimizer.kind", "\"adam\""}}},
      {"optimizer SGD", adam, R"({"optimizer": {"type": "SGD"}})", {{"optimizer.kind", "\"sgd\""}}},
      {"optimizer Adagrad", adam, R"({"optimizer": {"type": "Adagrad"}})", {{"optimizer.kind", "\"adagrad\""}}},
      {"optimizer Lion", adam, R"({"optimizer": {"type": "LION"}})", {{"optimizer.kind", "\"lion\""}}},
      {"params.lr",
       adam,
       R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
       {{"optimizer.groups[0].lr", "0.01"}}},
      {"params.betas",
       adam,
       R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.8, 0.95]}}})",
       {{"optimizer.groups[0].beta1", "0.8"}, {"optimizer.groups[0].beta2", "0.95"}}},
      {"params.eps",
       adam,
       R"({"optimizer": {"type": "AdamW", "params": {"eps": 1e-6}}})",
       {{"optimizer.groups[0].eps", "1e-06"}}},
      {"params.weight_decay",
       adam,
       R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": 0.1}}})",
       {{"optimizer.groups[0].weight_decay", "0.1"}}},
      {"params.bias_correction true, torch_adam",
       adam,
       R"({"optimizer": {"type": "AdamW", "params": {"bias_correction": true, "torch_adam": true}}})",
       {}},
      {"SGD params.momentum, dampening, nesterov",
       R"({"optimizer": {"type": "SGD"}})",
       R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9, "dampening": 0.0, "nesterov": true}}})",
       {{"optimizer.groups[0].momentum", "0.9"}, {"optimizer.groups[0].nesterov", "true"}}},
      {"SGD params.dampening",
       R"({"optimizer": {"type": "SGD"}})",
       R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9, "dampening": 0.5}}})",
       {{"optimizer.groups[0].momentum", "0.9"}, {"optimizer.groups[0].dampening", "0.5"}}},
      {"Adagrad params.lr_decay, initial_accumulator_value",
       R"({"optimizer": {"type": "Adagrad"}})",
       R"({"optimizer": {"type": "Adagrad", "params": {"lr_decay": 0.01, "initial_accumulator_value": 0.1}}})",
       {{"optimizer.groups[0].lr_decay", "0.01"}, {"optimizer.groups[0].initial_accumulator_value", "0.1"}}},
      {"train_batch_size", zero, R"({"train_batch_size": 64})", {{"loop.global_batch_size", "64"}}},
      {"train_micro_batch_size_per_gpu",
       zero,
       R"({"train_micro_batch_size_per_gpu": 8})",
       {{"loop.micro_batch_size", "8"}}},
      {"steps_per_print", zero, R"({"steps_per_print": 10})", {{"loop.log_every", "10"}}},
      {"communication_data_type",
       zero,
       R"({"zero_optimization": {}, "communication_data_type": "bf16"})",
       {{"reduce_dtype", "\"bf16\""}}},
      {"data_types.grad_accum_dtype",
       zero,
       R"({"zero_optimization": {}, "data_types": {"grad_accum_dtype": "fp16"}})",
       {{"grad_accum_dtype", "\"fp16\""}}},
      {"zero_optimization.mics_shard_size",
       R"({"zero_optimization": {"stage": 3}})",
       R"({"zero_optimization": {"stage": 3, "mics_shard_size": 8}})",
       {{"parallel.shard", "8"}}},
      {"zero_optimization.mics_shard_size -1 (one group of the whole world)",
       R"({"zero_optimization": {"stage": 3}})",
       R"({"zero_optimization": {"stage": 3, "mics_shard_size": -1}})",
       {}},
      {"prescale_gradients false, gradient_predivide_factor 1, gradient_allreduce_op mean",
       zero,
       R"({"zero_optimization": {}, "prescale_gradients": false, "gradient_predivide_factor": 1.0,
           "gradient_allreduce_op": "mean"})",
       {}},
  };
  for (const MappingCase& c : cases) {
    CAPTURE(c.name);
    const EngineConfig base = ds(c.base), got = ds(c.json);
    std::set<std::string> expected_keys;
    for (const auto& [k, v] : c.expect) expected_keys.insert(k);
    CHECK(changed(base, got) == expected_keys);
    for (const auto& [k, v] : c.expect) {
      CAPTURE(k);
      CHECK(value_of(got, k) == v);
    }
  }
}

TEST_CASE("DeepSpeed defaults: stage 0 without zero_optimization.stage; everything else our defaults") {
  const EngineConfig c = ds(R"({"zero_optimization": {}})");
  EngineConfig expected;
  expected.engine.stage = 0;
  CHECK(changed(expected, c).empty());
  CHECK(c.format == ConfigFormat::kDeepSpeed);
  CHECK(c.source == "ds.json (deepspeed)");
  CHECK(c.notes.empty());
}

TEST_CASE("the DeepSpeed fp16 values land in the loss scaler with their meaning") {
  const EngineConfig c = ds(R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
      "loss_scale_window": 100, "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 2}})");
  const optim::LossScalerOptions& d = c.engine.dynamic_loss_scaler;
  CHECK(c.model_dtype == DType::kFloat16);
  CHECK(c.engine.loss_scaling == LossScaling::kDynamic);
  CHECK(d.initial_scale == 4096.0f);  // 2^initial_scale_power
  CHECK(d.growth_interval == 100);    // loss_scale_window: good steps before the scale grows
  CHECK(d.hysteresis == 3);
  CHECK(d.consecutive_hysteresis);
  CHECK(d.min_scale == 2.0f);
  CHECK(d.growth_factor == 2.0f);  // DeepSpeed's fixed scale_factor, both ways
  CHECK(d.backoff_factor == 0.5f);
}

TEST_CASE("DeepSpeed keys accepted without effect are listed in the notes") {
  const EngineConfig c = ds(R"({"zero_optimization": {"stage": 3, "sub_group_size": 1e9,
      "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true,
      "mics_hierarchical_params_gather": true},
      "wall_clock_breakdown": false, "optimizer": {"type": "Adam", "params": {"torch_adam": true}},
      "fp16": {"enabled": false, "loss_scale_window": 100}})");
  std::string all;
  for (const std::string& n : c.notes) all += n + "\n";
  INFO(all);
  for (const char* key : {"zero_optimization.sub_group_size", "zero_optimization.stage3_max_reuse_distance",
                          "zero_optimization.stage3_gather_16bit_weights_on_model_save", "wall_clock_breakdown",
                          "optimizer.params.torch_adam", "fp16.loss_scale_window",
                          "zero_optimization.mics_hierarchical_params_gather"}) {
    CHECK(contains(all, std::string(key) + ": no effect"));
  }
  // fp16 disabled: its scaler settings change nothing.
  CHECK(c.engine.loss_scaling == LossScaling::kNone);
  CHECK(!c.model_dtype);
  // Stage-3 limits below stage 3 are noted too.
  const EngineConfig two = ds(R"({"zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": 100}})");
  REQUIRE(two.notes.size() == 1);
  CHECK(contains(two.notes[0], "no effect below stage 3"));
}

// ---------------------------------------------------------------------------------------------
// DeepSpeed refusals

TEST_CASE("an unknown DeepSpeed key fails naming it and the nearest known key") {
  const std::string e = ds_error(R"({"zero_optimization": {}, "train_batch_sise": 8})");
  CHECK(contains(e, "ds.json (deepspeed)"));
  CHECK(contains(e, "unknown key train_batch_sise"));
  CHECK(contains(e, "did you mean train_batch_size?"));
}

TEST_CASE("a typo in a nested DeepSpeed key names its full path") {
  CHECK(contains(ds_error(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_sise": 5e7}})"),
                 "unknown key zero_optimization.stage3_prefetch_bucket_sise (did you mean "
                 "zero_optimization.stage3_prefetch_bucket_size?)"));
  CHECK(contains(ds_error(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memroy": true}}})"),
                 "unknown key zero_optimization.offload_optimizer.pin_memroy (did you mean "
                 "zero_optimization.offload_optimizer.pin_memory?)"));
  CHECK(contains(ds_error(R"({"fp16": {"enabled": true, "loss_scale_windw": 10}})"),
                 "did you mean fp16.loss_scale_window?"));
  CHECK(contains(ds_error(R"({"optimizer": {"type": "AdamW", "parms": {"lr": 0.1}}})"),
                 "unknown key optimizer.parms (did you mean optimizer.params?)"));
}

TEST_CASE("fp16 and bf16 both enabled is refused") {
  const std::string e = ds_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  CHECK(contains(e, "fp16.enabled and bf16.enabled are both true"));
}

TEST_CASE("NVMe offload is refused") {
  CHECK(contains(ds_error(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})"),
                 "zero_optimization.offload_optimizer.device = nvme is not supported"));
  CHECK(contains(ds_error(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                             "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}})"),
                 "zero_optimization.offload_param.device = nvme is not supported"));
  CHECK(
      contains(ds_error(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})"), "must be cpu or none"));
  CHECK(contains(ds_error(R"({"zero_optimization": {"offload_optimizer": {"pin_memory": true}}})"),
                 "zero_optimization.offload_optimizer.device is required"));
}

TEST_CASE("\"auto\" values are refused naming the key") {
  CHECK(contains(ds_error(R"({"train_batch_size": "auto"})"), "train_batch_size is \"auto\""));
  CHECK(contains(ds_error(R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})"),
                 "optimizer.params.lr is \"auto\""));
  CHECK(contains(ds_error(R"({"fp16": {"enabled": "auto"}})"), "fp16.enabled is \"auto\""));
  CHECK(contains(ds_error(R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}})"),
                 "zero_optimization.reduce_bucket_size is \"auto\""));
  CHECK(
      contains(ds_error(R"({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": "auto"}})"),
               "stage3_gather_16bit_weights_on_model_save is \"auto\""));
}

TEST_CASE("different allgather and reduce bucket sizes are refused naming both") {
  const std::string e = ds_error(R"({"zero_optimization": {"allgather_bucket_size": 5e8, "reduce_bucket_size": 2e8}})");
  CHECK(contains(e, "zero_optimization.reduce_bucket_size (200000000)"));
  CHECK(contains(e, "zero_optimization.allgather_bucket_size (500000000)"));
  CHECK(contains(e, "one bucket size"));
}

TEST_CASE("settings the engine always has cannot be turned off") {
  for (const char* key : {"overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions"}) {
    CAPTURE(key);
    const std::string e = ds_error(std::string(R"({"zero_optimization": {")") + key + R"(": false}})");
    CHECK(contains(e, std::string("zero_optimization.") + key + " = false is not supported: the engine always"));
  }
  CHECK(contains(ds_error(R"({"optimizer": {"type": "Adam", "params": {"bias_correction": false}}})"),
                 "optimizer.params.bias_correction = false is not supported"));
  CHECK(contains(ds_error(R"({"zero_optimization": {"stage": 2, "zero_quantized_gradients": true}})"),
                 "quantized_gradients (qgZ) needs stage 3"));
  CHECK(contains(ds_error(R"({"zero_optimization": {"stage": 2, "zero_quantized_weights": true}})"),
                 "quantized_weights (qwZ) needs stage 3"));
  CHECK(contains(ds_error(R"({"zero_optimization": {"zero_hpz_partition_size": 8}})"),
                 "secondary_shard (hpZ) needs stage 3"));
  CHECK(contains(ds_error(R"({"zero_optimization": {}, "scheduler": {"type": "WarmupLR"}})"),
                 "scheduler is not supported"));
  CHECK(contains(ds_error(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 0.3}}})"),
                 "zero_optimization.offload_optimizer.ratio = 0.3 is not supported"));
  CHECK(contains(ds_error(R"({"zero_optimization": {}, "gradient_allreduce_op": "sum"})"), "\"mean\""));
}

TEST_CASE("ZeRO++ hpZ of 1 rank per group is no hpZ") {
  CHECK(changed(ds(R"({"zero_optimization": {"stage": 3}})"),
                ds(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 1}})"))
            .empty());
}

TEST_CASE("the parallel layout: the layout's own reader, its errors naming the key") {
  const EngineConfig c = ours(R"({"stage": 2, "micro_batches": 8,
                                  "parallel": {"tp": 2, "sequence_parallel": true, "pp": 4, "schedule": "zb-h1"}})");
  CHECK(c.layout.tp == 2);
  CHECK(c.layout.pp == 4);
  CHECK(c.layout.schedule == "zb-h1");
  CHECK(c.layout.dp == 0);  // the world's rest
  CHECK_FALSE(c.layout.recompute);
  // The engine's fields, copied in: a file states them once.
  CHECK(c.layout.stage == 2);
  CHECK(c.layout.micro_batches == 8);
  CHECK(ours(R"({"micro_batches": 4, "parallel": {"pp": 2}})").layout.micro_batches == 4);
  CHECK(ours("{}").layout == EngineConfig{}.layout);
  CHECK(EngineConfig{}.layout == Layout{.dp = 0, .stage = 2});
  CHECK(contains(our_error(R"({"parallel": {"tp": 0}})"), "ours.json (ours): parallel: tp=0 is not an integer in [1,"));
  CHECK(contains(our_error(R"({"parallel": {"dp": -2}})"), "parallel: dp=-2 is not an integer in [0,"));
  CHECK(contains(our_error(R"({"parallel": {"pp": 2, "chunks": 0}})"), "parallel: chunks=0 is not an integer in [1,"));
  CHECK(contains(our_error(R"({"parallel": {"sequence_parallel": true}})"),
                 "ours.json (ours): parallel: sequence_parallel needs tp above 1"));
  CHECK(contains(our_error(R"({"parallel": {"pp": 2, "schedule": "interleaved"}})"),
                 "parallel: the interleaved schedule and chunks above 1 go together"));
  CHECK(contains(our_error(R"({"parallel": {"schedule": 3, "pp": 2}})"), "parallel.schedule must be a string, got 3"));
  CHECK(contains(our_error(R"({"parallel": {"tensor_parallel": 2}})"), "parallel.tensor_parallel: not a layout field"));
  CHECK(contains(our_error(R"({"parallel": {"stage": 3}})"),
                 "parallel.stage: not a layout field of this section (the engine's options carry it)"));
  CHECK(contains(our_error(R"({"parallel": {"order": "pp,tp"}})"), "mesh order 'pp,tp': expected pp, dp and tp once each"));
}

TEST_CASE("hybrid sharding: a shard group size below 0, or with stage 0, is refused naming the key") {
  CHECK(contains(our_error(R"({"parallel": {"shard": -4}})"), "ours.json (ours): parallel: shard=-4 is not an integer in [0,"));
  CHECK(contains(our_error(R"({"parallel": {"shard": 2.5}})"), "parallel.shard must be an integer, got 2.5"));
  CHECK(contains(our_error(R"({"parallel": {"shard_groups": 2}})"), "parallel.shard_groups: not a layout field"));
  CHECK(contains(our_error(R"({"stage": 0, "parallel": {"shard": 2}})"),
                 "ours.json (ours): parallel: shard=2 needs a sharded stage (1-3); stage 0 shards nothing"));
  CHECK(contains(our_error(R"({"stage": 1, "parallel": {"dp": 6, "shard": 4}})"), "parallel: shard=4 does not divide dp=6"));
  for (const char* size : {"0", "-2"}) {
    CAPTURE(size);
    CHECK(contains(ds_error(std::string(R"({"zero_optimization": {"stage": 3, "mics_shard_size": )") + size + "}}"),
                   std::string("ds.json (deepspeed): zero_optimization.mics_shard_size must be -1 (one group of the "
                               "whole world) or a positive integer, got ") +
                       size));
  }
  CHECK(contains(ds_error(R"({"zero_optimization": {"stage": 3, "mics_shard_size": "4"}})"),
                 "zero_optimization.mics_shard_size must be an integer, got \"4\" (a string)"));
  // DeepSpeed's stage defaults to 0.
  const std::string stage0 = ds_error(R"({"zero_optimization": {"mics_shard_size": 4}})");
  CHECK(contains(stage0, "shard=4 needs a sharded stage"));
  CHECK(contains(stage0, "(set by zero_optimization.mics_shard_size)"));
  // Stages 1 to 3 shard, so each takes a shard group size.
  for (int stage = 1; stage <= 3; ++stage) {
    CAPTURE(stage);
    CHECK(ours(R"({"stage": )" + std::to_string(stage) + R"(, "parallel": {"shard": 2}})").layout.shard == 2);
  }
  CHECK(ours(R"({"stage": 1})").layout.shard == 0);
}

TEST_CASE("optimizer types and parameters: unsupported ones are refused") {
  CHECK(contains(ds_error(R"({"optimizer": {"type": "Lamb"}})"), "optimizer.type \"Lamb\" is not supported"));
  CHECK(contains(ds_error(R"({"zero_optimization": {"cpu_offload": true, "offload_optimizer": {"device": "none"}}})"),
                 "zero_optimization.cpu_offload and zero_optimization.offload_optimizer.device both say where"));
  CHECK(contains(ds_error(R"({"optimizer": {"params": {"lr": 0.1}}})"), "optimizer.type is required"));
  CHECK(contains(ds_error(R"({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})"),
                 "optimizer.params.momentum does not apply to AdamW"));
  CHECK(contains(ds_error(R"({"optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})"),
                 "optimizer.params.betas does not apply to SGD"));
  CHECK(contains(ds_error(R"({"optimizer": {"type": "SGD", "adam_w_mode": true}})"), "adam_w_mode does not apply"));
  CHECK(contains(ds_error(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})"), "contradiction"));
  CHECK(contains(ds_error(R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})"),
                 "optimizer.params.betas must be an array of two numbers"));
}

TEST_CASE("wrong JSON types name the key and the type expected") {
  CHECK(contains(ds_error(R"({"zero_optimization": {"stage": "3"}})"),
                 "zero_optimization.stage must be a non-negative integer, got \"3\" (a string)"));
  CHECK(contains(ds_error(R"({"zero_optimization": {"reduce_bucket_size": -5}})"),
                 "zero_optimization.reduce_bucket_size must be a positive integer, got -5"));
  CHECK(contains(ds_error(R"({"gradient_accumulation_steps": 2.5})"),
                 "gradient_accumulation_steps must be a positive integer, got 2.5"));
  CHECK(contains(ds_error(R"({"zero_optimization": {"stage": 4}})"), "zero_optimization.stage must be at most 3"));
  CHECK(contains(ds_error(R"({"fp16": {"enabled": 1}})"), "fp16.enabled must be true or false, got 1"));
  CHECK(contains(ds_error(R"({"zero_optimization": []})"), "zero_optimization must be an object"));
  CHECK(contains(ds_error(R"({"gradient_clipping": "1.0"})"), "gradient_clipping must be a number"));
  CHECK(contains(ds_error(R"({"gradient_clipping": 1e300})"), "outside the range of a 32-bit float"));
  // Bytes beyond what our format reads back (sizes up to 2^63 - 1) are refused.
  CHECK(contains(ds_error(R"({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 4e18}})"),
                 "zero_optimization.stage3_max_live_parameters = 4000000000000000000 elements is too large"));
  CHECK(contains(our_error(R"({"layout": {"bucket_numel": -5}})"),
                 "layout.bucket_numel must be a non-negative integer, got -5"));
  CHECK(contains(our_error(R"({"stage": 2.5})"), "stage must be an integer, got 2.5"));
  CHECK(contains(our_error(R"({"deterministic": "yes"})"), "deterministic must be true or false"));
  CHECK(contains(our_error(R"({"reduce_dtype": "float32"})"), "reduce_dtype: unknown dtype 'float32'"));
  CHECK(contains(our_error(R"({"optimizer": {"kind": "adamax"}})"), "optimizer.kind: unknown optimizer 'adamax'"));
  CHECK(contains(our_error(R"({"optimizer": {"groups": []}})"), "optimizer.groups must be a non-empty array"));
  CHECK(contains(our_error(R"({"timeout_ms": 0})"), "timeout_ms must be a positive integer"));
}

TEST_CASE("values out of range fail naming the option, and for DeepSpeed the key that set it") {
  CHECK(contains(our_error(R"({"stage": 7})"), "EngineOptions.stage must be 0, 1, 2 or 3"));
  CHECK(contains(our_error(R"({"optimizer": {"groups": [{}, {"lr": -1}]}})"), "optimizer.groups[1].lr must be >= 0"));
  CHECK(contains(our_error(R"({"optimizer": {"state_dtype": "fp16"}})"), "optimizer.state_dtype must be fp32 or bf16"));
  CHECK(contains(our_error(R"({"dynamic_loss_scaler": {"growth_factor": 0.5}})"),
                 "dynamic_loss_scaler.growth_factor must be finite and >= 1"));
  CHECK(contains(our_error(R"({"layout": {"alignment": 16, "block": 24}})"),
                 "layout.block (24) must be a positive multiple"));
  CHECK(contains(our_error(R"({"loop": {"log_every": 0}})"), "loop.log_every must be >= 1"));
  CHECK(contains(our_error(R"({"model_dtype": "int32"})"), "model_dtype must be fp32, fp16 or bf16"));
  CHECK(contains(our_error(R"({"max_grad_norm": -1})"), "EngineOptions.max_grad_norm must be >= 0"));
  const std::string lr = ds_error(R"({"optimizer": {"type": "AdamW", "params": {"lr": -1}}})");
  CHECK(contains(lr, "optimizer.groups[0].lr must be >= 0"));
  CHECK(contains(lr, "(set by optimizer.params.lr)"));
  CHECK(contains(ds_error(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.5]}}})"),
                 "(set by optimizer.params.betas[1])"));
  const std::string offload = ds_error(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})");
  CHECK(contains(offload, "EngineOptions.offload.params needs stage 3"));
  CHECK(contains(offload, "(set by zero_optimization.offload_param.device)"));
  CHECK(contains(ds_error(R"({"gradient_clipping": -1})"), "(set by gradient_clipping)"));
  CHECK(contains(ds_error(R"({"fp16": {"enabled": true, "initial_scale_power": 0, "min_loss_scale": 4}})"),
                 "(set by fp16.min_loss_scale)"));
  CHECK(contains(
      ds_error(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})"),
      "train_batch_size (30) is not a multiple"));
  CHECK(contains(ds_error(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})"),
                 "train_batch_size (30) is not a multiple of train_micro_batch_size_per_gpu (4)"));
}

TEST_CASE("malformed JSON names the file and the position; a repeated key is refused") {
  const std::string e = error_of([] { parse_engine_config("{\n  \"stage\": 3,\n}", "broken.json"); });
  CHECK(contains(e, "broken.json: malformed JSON"));
  CHECK(contains(e, "line 3, column 1"));
  CHECK(contains(error_of([] { parse_engine_config("", "empty.json"); }), "empty.json: malformed JSON"));
  CHECK(contains(error_of([] { parse_engine_config(R"({"stage": 1, "stage": 3})", "twice.json"); }),
                 "twice.json: key \"stage\" appears twice"));
  CHECK(contains(error_of([] { parse_engine_config(R"({"a": {"x": 1}, "b": {"x": 2}})", "ok.json"); }),
                 "unknown key a"));  // equal keys in different objects are fine
  CHECK(contains(error_of([] { parse_engine_config("[1, 2]", "list.json"); }), "the top level must be an object"));
  // Deep nesting is named, not printed.
  const std::string deep = std::string(10000, '[') + std::string(10000, ']');
  CHECK(contains(error_of([&] { parse_engine_config(deep, "deep.json"); }), "must be an object, got an array"));
}

TEST_CASE("load_engine_config reads a file and names it when it cannot") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "engine_config_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "ours.json").string();
  std::ofstream(path) << R"({"stage": 1})";
  const EngineConfig c = load_engine_config(path);
  CHECK(c.engine.stage == 1);
  CHECK(c.source == path + " (ours)");
  const std::string missing = (dir / "missing.json").string();
  try {
    load_engine_config(missing);
    FAIL("no error");
  } catch (const IoError& e) {
    CHECK(contains(e.what(), missing));
  }
  CHECK_THROWS_AS(load_engine_config(dir.string()), IoError);  // a directory
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// Our format

TEST_CASE("format detection") {
  CHECK(parse_engine_config(R"({"stage": 3})", "a.json").format == ConfigFormat::kNative);
  CHECK(parse_engine_config("{}", "a.json").source == "a.json (ours)");
  CHECK(parse_engine_config(R"({"optimizer": {"kind": "sgd"}})", "a.json").format == ConfigFormat::kNative);
  CHECK(parse_engine_config(R"({"micro_batches": 2})", "a.json").format == ConfigFormat::kNative);
  for (const char* text :
       {R"({"zero_optimization": {}})", R"({"fp16": {}})", R"({"bf16": {}})", R"({"gradient_clipping": 1})",
        R"({"train_batch_size": 8})", R"({"train_micro_batch_size_per_gpu": 8})", R"({"steps_per_print": 8})",
        R"({"optimizer": {"type": "SGD"}})"}) {
    CAPTURE(text);
    const EngineConfig c = parse_engine_config(text, "b.json");
    CHECK(c.format == ConfigFormat::kDeepSpeed);
    CHECK(c.source == "b.json (deepspeed)");
  }
}

TEST_CASE("our format: missing keys keep the struct's defaults") {
  const EngineConfig c = ours("{}");
  CHECK(changed(EngineConfig{}, c).empty());
  CHECK(fingerprint(c.engine) == fingerprint(EngineOptions{}));
  CHECK(ours(R"({"optimizer": {"groups": [{"lr": 0.5}]}})").engine.optimizer.groups[0].beta2 == 0.999f);
}

TEST_CASE("our format: an unknown or misspelt key fails naming its path and the nearest key") {
  CHECK(contains(our_error(R"({"stgae": 3})"), "ours.json (ours): unknown key stgae (did you mean stage?)"));
  CHECK(contains(our_error(R"({"optimizer": {"groups": [{"lr": 0.1}, {"weight_decy": 0.1}]}})"),
                 "unknown key optimizer.groups[1].weight_decy (did you mean optimizer.groups[1].weight_decay?)"));
  CHECK(contains(our_error(R"({"offload": {"pinned": false}})"),
                 "unknown key offload.pinned (did you mean offload.params?)"));
  CHECK(contains(our_error(R"({"loop": {"log_evry": 5}})"), "did you mean loop.log_every?"));
}

// Every field set to something other than its default.
EngineConfig every_field_changed() {
  EngineConfig c;
  EngineOptions& o = c.engine;
  o.stage = 3;
  // Adagrad: the SGD-only fields can take any value (SGD's rules would forbid nesterov with dampening).
  o.optimizer.kind = optim::OptimizerKind::kAdagrad;
  o.optimizer.groups = {optim::Hyper{.lr = 0.125f,
                                     .weight_decay = 0.01f,
                                     .beta1 = 0.8f,
                                     .beta2 = 0.95f,
                                     .eps = 1e-6f,
                                     .momentum = 0.9f,
                                     .dampening = 0.2f,
                                     .nesterov = true,
                                     .lr_decay = 0.5f,
                                     .initial_accumulator_value = 0.25f,
                                     .kind = optim::OptimizerKind::kAdagrad,
                                     .muon = {.momentum = 0.9f, .nesterov = true, .ns_steps = 3, .rms_scale = 0.3f, .per_part = true,
                                              .bf16 = true},
                                     .adafactor = {.eps1 = 1e-20f,
                                                   .eps2 = 2e-3f,
                                                   .clip_threshold = 0.5f,
                                                   .decay_rate = 0.7f,
                                                   .relative_step = true,
                                                   .beta1 = 0.5f},
                                     .params = {"h.*.weight", "lm_head.?"}},
                        optim::Hyper{.lr = 0.1f, .dampening = 0.1f}};
  o.optimizer.state_dtype = DType::kBFloat16;
  o.optimizer.num_threads = 3;
  o.optimizer.simd_path = SimdPath::kScalar;
  o.optimizer.quant_block = 512;
  o.optimizer.quant_min_numel = 1000;
  o.max_grad_norm = 0.75f;
  o.param_dtype = DType::kFloat16;
  o.reduce_dtype = DType::kBFloat16;
  o.grad_accum_dtype = DType::kBFloat16;
  o.micro_batches = 3;
  o.micro_batch_reduce = MicroBatchReduce::kOnce;
  o.micro_batch_gather = MicroBatchGather::kEach;
  o.deterministic = true;
  o.loss_scaling = LossScaling::kStatic;
  o.static_loss_scale = 256.0f;
  o.dynamic_loss_scaler = {.initial_scale = 1024.0f,
                           .growth_factor = 4.0f,
                           .backoff_factor = 0.25f,
                           .growth_interval = 100,
                           .hysteresis = 3,
                           .min_scale = 2.0f,
                           .consecutive_hysteresis = true};
  o.layout = {.alignment = 32, .bucket_numel = 4096, .block = 2048, .whole_tensors = true};
  o.max_inflight_buckets = 5;
  o.reshard_after_forward = false;
  o.prefetch_bytes = 1 << 20;
  o.max_live_gathered_bytes = size_t{3} << 30;
  o.param_persistence_bytes = 4096;
  o.quantized_weights = {.bits = 4, .block = 128, .backward = false, .evaluation = true};
  o.node_size = 2;
  o.secondary_shard = true;
  o.quantized_gradients = {.bits = 8, .block = 64, .stochastic = true};
  o.offload = {.optimizer = true, .params = true, .pinned_staging = false};
  o.replica_check_every = 50;
  o.timeout = std::chrono::milliseconds(1234);
  c.model_dtype = DType::kBFloat16;
  c.loop = {.micro_batch_size = 4, .global_batch_size = 64, .log_every = 10, .infer_micro_batches = true};
  c.layout = {.dp = 2,
              .tp = 2,
              .pp = 2,
              .schedule = "interleaved",
              .chunks = 2,
              .sequence_parallel = true,
              .recompute = true,
              .shard = 2,
              .order = {MeshDim::kTp, MeshDim::kDp, MeshDim::kPp}};
  return c;
}

TEST_CASE("our format round-trips every field") {
  const EngineConfig c = every_field_changed();
  const std::string text = to_native_json(c);
  INFO(text);
  const EngineConfig back = ours(text);
  // fingerprint() is written separately from the parser: every option it lists comes back...
  CHECK(fingerprint(back.engine) == fingerprint(c.engine));
  // ...and the test really changed each of them (the group count aside, both lists have the size).
  const auto base = fingerprint(EngineOptions{});
  const auto mine = fingerprint(c.engine);
  for (const auto& [field, value] : base) {
    if (field.find("groups[1]") != std::string::npos || field == "EngineOptions.optimizer.groups.size") continue;
    CAPTURE(field);
    const auto it = std::find_if(mine.begin(), mine.end(), [&](const auto& p) { return p.first == field; });
    REQUIRE(it != mine.end());
    CHECK(it->second != value);
  }
  // The options fingerprint() leaves out (local resources), and the loop and model settings.
  CHECK(back.engine.optimizer.num_threads == 3);
  CHECK(back.engine.optimizer.simd_path == SimdPath::kScalar);
  CHECK(back.engine.max_inflight_buckets == 5);
  CHECK(back.engine.offload.pinned_staging == false);
  CHECK(back.engine.timeout == std::chrono::milliseconds(1234));
  CHECK(back.model_dtype == DType::kBFloat16);
  CHECK(back.loop.micro_batch_size == 4);
  CHECK(back.loop.global_batch_size == 64);
  CHECK(back.loop.log_every == 10);
  CHECK(back.loop.infer_micro_batches);
  // The layout comes back whole: the parallel section's fields, and the engine's copied in.
  Layout want = c.layout;
  want.stage = c.engine.stage;
  want.offload_optimizer = want.offload_params = true;
  want.micro_batches = c.engine.micro_batches;
  CHECK(back.layout == want);
  CHECK(back.engine.optimizer.groups.size() == 2);
  CHECK(back.engine.optimizer.groups[1].dampening == 0.1f);
  // Every key of the format differs from the default config, so none is written without being read.
  const auto changed_keys = changed(EngineConfig{}, c);
  for (std::string key : native_config_keys()) {
    const size_t brackets = key.find("[]");
    if (brackets != std::string::npos) key.replace(brackets, 2, "[0]");
    CAPTURE(key);
    CHECK(changed_keys.count(key) == 1);
  }
  CHECK(to_native_json(back) == text);
}

TEST_CASE("our format reads hand-written values") {
  const EngineConfig c = ours(R"({
    "stage": 1,
    "optimizer": {"kind": "lion", "groups": [{"lr": 1e-4, "weight_decay": 0.1}], "state_dtype": "bf16"},
    "layout": {"bucket_numel": 5e6},
    "loss_scaling": "dynamic",
    "dynamic_loss_scaler": {"growth_interval": 10},
    "timeout_ms": 60000,
    "model_dtype": "bf16",
    "loop": {"log_every": 5}
  })");
  CHECK(c.engine.stage == 1);
  CHECK(c.engine.optimizer.kind == optim::OptimizerKind::kLion);
  CHECK(c.engine.optimizer.groups.size() == 1);
  CHECK(c.engine.optimizer.groups[0].lr == 1e-4f);
  CHECK(c.engine.optimizer.state_dtype == DType::kBFloat16);
  CHECK(c.engine.layout.bucket_numel == 5000000);
  CHECK(c.engine.layout.block == 1024);  // untouched fields of a given object keep their defaults
  CHECK(c.engine.loss_scaling == LossScaling::kDynamic);
  CHECK(c.engine.dynamic_loss_scaler.growth_interval == 10);
  CHECK(c.engine.timeout == std::chrono::minutes(1));
  CHECK(c.model_dtype == DType::kBFloat16);
  CHECK(c.loop.log_every == 5);
  CHECK(!c.loop.micro_batch_size);
}

TEST_CASE("native_config_keys lists each key once") {
  const auto keys = native_config_keys();
  CHECK(std::set<std::string>(keys.begin(), keys.end()).size() == keys.size());
  for (const char* key : {"stage", "optimizer.kind", "optimizer.groups[].lr", "optimizer.groups[].nesterov",
                          "optimizer.simd_path", "dynamic_loss_scaler.consecutive_hysteresis", "layout.block",
                          "offload.pinned_staging", "timeout_ms", "model_dtype", "loop.micro_batch_size",
                          "parallel.shard", "parallel.order"}) {
    CAPTURE(key);
    CHECK(std::find(keys.begin(), keys.end(), key) != keys.end());
  }
}

// ---------------------------------------------------------------------------------------------
// Realistic DeepSpeed configs

// The shape of the ZeRO-2 configs Megatron-LM's DeepSpeed scripts ship (written here, values of our
// own): model and logging keys beside the engine's.
constexpr const char* kMegatronStyle = R"({
  "train_batch_size": 64,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 4,
  "steps_per_print": 10,
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 2, "allgather_partitions": true, "reduce_scatter": true,
                        "allgather_bucket_size": 50000000, "overlap_comm": true, "contiguous_gradients": true},
  "optimizer": {"type": "Adam", "params": {"lr": 0.00015, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
  "bf16": {"enabled": true},
  "wall_clock_breakdown": true,
  "activation_checkpointing": {"partition_activations": true, "contiguous_memory_optimization": true,
                               "cpu_checkpointing": false, "number_checkpoints": 4}
})";

TEST_CASE("DeepSpeed configs as users have them: model and logging keys accepted, each with a note; strict refuses them") {
  const EngineConfig c = parse_engine_config(kMegatronStyle, "megatron.json");
  CHECK(c.format == ConfigFormat::kDeepSpeed);
  CHECK(c.engine.stage == 2);
  CHECK(c.engine.micro_batches == 4);
  CHECK(c.layout.recompute);  // activation_checkpointing: the model recomputes its blocks
  auto noted = [&](const std::string& key) {
    return std::count_if(c.notes.begin(), c.notes.end(), [&](const std::string& n) { return n.rfind(key + ":", 0) == 0; });
  };
  CHECK(noted("activation_checkpointing") == 1);
  CHECK(noted("activation_checkpointing.partition_activations") == 1);
  CHECK(noted("activation_checkpointing.number_checkpoints") == 1);
  CHECK(noted("wall_clock_breakdown") == 1);
  // Strict: every key must take effect, so the model's and the logging's are refused by name.
  auto strict_error = [](const std::string& text) {
    try {
      parse_engine_config(text, "megatron.json", {.strict = true});
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(contains(strict_error(kMegatronStyle),
                 "megatron.json (deepspeed): activation_checkpointing is the model's (strict reading): set the "
                 "layout's recompute instead"));
  CHECK(contains(strict_error(R"({"zero_optimization": {"stage": 1}, "wall_clock_breakdown": true})"),
                 "wall_clock_breakdown has no effect here (strict reading)"));
  CHECK(parse_engine_config(R"({"zero_optimization": {"stage": 1}})", "a.json", {.strict = true}).engine.stage == 1);
  // Unknown keys stay refused, strict or not, and a misspelled sub-key is named.
  CHECK(contains(ds_error(R"({"activation_checkpointing": {"partition_activation": true}})"),
                 "unknown key activation_checkpointing.partition_activation (did you mean "
                 "activation_checkpointing.partition_activations?)"));
}

TEST_CASE("a DeepSpeed ZeRO-3 config with CPU offload parses to the expected options") {
  // The shape of the ZeRO-3 examples in DeepSpeed's and HuggingFace's docs, values resolved.
  const EngineConfig c = ds(R"({
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "steps_per_print": 100,
    "gradient_clipping": 1.0,
    "optimizer": {
      "type": "AdamW",
      "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
    },
    "bf16": {"enabled": true},
    "zero_optimization": {
      "stage": 3,
      "overlap_comm": true,
      "contiguous_gradients": true,
      "reduce_bucket_size": 5e7,
      "stage3_prefetch_bucket_size": 5e7,
      "stage3_param_persistence_threshold": 1e5,
      "stage3_max_live_parameters": 1e9,
      "stage3_max_reuse_distance": 1e9,
      "sub_group_size": 1e9,
      "stage3_gather_16bit_weights_on_model_save": true,
      "offload_optimizer": {"device": "cpu", "pin_memory": true},
      "offload_param": {"device": "cpu", "pin_memory": true}
    },
    "wall_clock_breakdown": false
  })");
  const EngineOptions& o = c.engine;
  CHECK(o.stage == 3);
  CHECK(o.optimizer.kind == optim::OptimizerKind::kAdamW);
  REQUIRE(o.optimizer.groups.size() == 1);
  CHECK(o.optimizer.groups[0].lr == 3e-4f);
  CHECK(o.optimizer.groups[0].beta1 == 0.9f);
  CHECK(o.optimizer.groups[0].beta2 == 0.95f);
  CHECK(o.optimizer.groups[0].eps == 1e-8f);
  CHECK(o.optimizer.groups[0].weight_decay == 0.1f);
  CHECK(c.model_dtype == DType::kBFloat16);
  CHECK(o.loss_scaling == LossScaling::kNone);
  CHECK(o.max_grad_norm == 1.0f);
  CHECK(o.micro_batches == 2);
  CHECK(o.layout.bucket_numel == 50'000'000);
  CHECK(o.prefetch_bytes == 100'000'000);             // 5e7 bf16 elements
  CHECK(o.param_persistence_bytes == 200'000);        // 1e5 bf16 elements
  CHECK(o.max_live_gathered_bytes == 2'000'000'000);  // 1e9 bf16 elements
  CHECK(o.offload.optimizer);
  CHECK(o.offload.params);
  CHECK(o.offload.pinned_staging);
  CHECK(o.reduce_dtype == DType::kFloat32);  // our default, not DeepSpeed's (it reduces in the model dtype)
  CHECK(c.loop.global_batch_size == 64);
  CHECK(c.loop.micro_batch_size == 4);
  CHECK(c.loop.log_every == 100);
  CHECK(c.notes.size() == 4);  // reuse distance, sub-group size, 16-bit gather on save, wall-clock breakdown
  CHECK(resolve_global_batch(c.loop, o.micro_batches, 8) == 64);
  CHECK_THROWS_AS(resolve_global_batch(c.loop, o.micro_batches, 4), InvalidArgument);
}

TEST_CASE("a DeepSpeed ZeRO-2 fp16 config parses to the expected options") {
  const EngineConfig c = ds(R"({
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "Adam", "params": {"lr": 0.00015, "weight_decay": 0.01}},
    "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "zero_optimization": {"stage": 2, "allgather_partitions": true, "allgather_bucket_size": 2e8,
                          "overlap_comm": true, "reduce_scatter": true, "reduce_bucket_size": 2e8,
                          "contiguous_gradients": true}
  })");
  const EngineOptions& o = c.engine;
  CHECK(o.stage == 2);
  CHECK(o.optimizer.kind == optim::OptimizerKind::kAdamW);  // adam_w_mode's default
  CHECK(o.optimizer.groups[0].lr == 0.00015f);
  CHECK(c.model_dtype == DType::kFloat16);
  CHECK(o.loss_scaling == LossScaling::kDynamic);
  CHECK(o.dynamic_loss_scaler.initial_scale == 65536.0f);
  CHECK(o.dynamic_loss_scaler.growth_interval == 1000);
  CHECK(o.layout.bucket_numel == 200'000'000);
  CHECK(c.notes.empty());
  CHECK(resolve_global_batch(c.loop, 1, 4) == 64);
}

TEST_CASE("resolve_global_batch: DeepSpeed's batch rule") {
  CHECK(!resolve_global_batch(LoopConfig{}, 2, 4));
  CHECK(resolve_global_batch(LoopConfig{.micro_batch_size = 4}, 2, 4) == 32);
  CHECK(resolve_global_batch(LoopConfig{.global_batch_size = 32}, 2, 4) == 32);
  CHECK(resolve_global_batch(LoopConfig{.micro_batch_size = 4, .global_batch_size = 32}, 2, 4) == 32);
  CHECK(
      contains(error_of([] { resolve_global_batch(LoopConfig{.micro_batch_size = 4, .global_batch_size = 32}, 2, 2); }),
               "the micro batch (loop.micro_batch_size, train_micro_batch_size_per_gpu) 4 x "
               "micro_batches 2 x 2 rank(s) is 16"));
  CHECK(contains(error_of([] { resolve_global_batch(LoopConfig{.global_batch_size = 30}, 2, 4); }),
                 "30 is not a multiple of micro_batches 2 x 4 rank(s)"));
}

TEST_CASE("DeepSpeed's batch sizes without gradient_accumulation_steps: the micro-batches inferred at launch") {
  const EngineConfig c = ds(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4})");
  CHECK(c.loop.infer_micro_batches);
  CHECK(std::any_of(c.notes.begin(), c.notes.end(), [](const std::string& n) {
    return contains(n, "gradient_accumulation_steps: not given; train_batch_size / (train_micro_batch_size_per_gpu x "
                       "data-parallel ranks) = 64 / (4 x ranks) at launch");
  }));
  // DeepSpeed's rule: 64 / (4 x dp).
  CHECK(resolve_micro_batches(c, 1) == 16);
  CHECK(resolve_micro_batches(c, 2) == 8);
  CHECK(resolve_micro_batches(c, 16) == 1);
  CHECK(resolve_global_batch(c.loop, resolve_micro_batches(c, 2), 2) == 64);
  CHECK(contains(error_of([&] { resolve_micro_batches(c, 3); }),
                 "ds.json (deepspeed): the global batch (loop.global_batch_size, DeepSpeed's train_batch_size) 64 is not a multiple "
                 "of the micro batch (loop.micro_batch_size, train_micro_batch_size_per_gpu) 4 x 3 data-parallel rank(s)"));
  // Given, the steps stand; and a file that does not ask for inference keeps its micro-batches.
  const EngineConfig given = ds(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
                                    "gradient_accumulation_steps": 2})");
  CHECK(!given.loop.infer_micro_batches);
  CHECK(resolve_micro_batches(given, 3) == 2);
  // Ours: the key needs both sizes.
  CHECK(contains(error_of([] { parse_native_config(R"({"loop": {"infer_micro_batches": true}})", "n.json"); }),
                 "loop.infer_micro_batches needs loop.global_batch_size and loop.micro_batch_size"));
}

// ---------------------------------------------------------------------------------------------
// docs/config.md against the code

// The backquoted first column of every table row between `heading` and the next "## " heading.
std::vector<std::string> table_keys(const std::string& doc, const std::string& heading) {
  const size_t start = doc.find("\n" + heading + "\n");
  REQUIRE_MESSAGE(start != std::string::npos, "docs/config.md has no heading '" << heading << "'");
  const size_t end = doc.find("\n## ", start + 1);
  std::istringstream in(doc.substr(start, end == std::string::npos ? std::string::npos : end - start));
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    const size_t close = line.find('`', 3);
    keys.push_back(line.substr(3, close - 3));
  }
  return keys;
}

TEST_CASE("docs/config.md documents exactly the keys of our format, and its examples parse") {
  const std::string doc = read_text("docs/config.md");
  const std::vector<std::string> documented = table_keys(doc, "## Our format: every key");
  const std::vector<std::string> keys = native_config_keys();
  for (const std::string& key : keys) {
    CAPTURE(key);
    CHECK(std::count(documented.begin(), documented.end(), key) == 1);
  }
  for (const std::string& key : documented) {
    CAPTURE(key);
    CHECK(std::find(keys.begin(), keys.end(), key) != keys.end());
  }
  // Every ```json block is a config that parses; the page shows both formats.
  std::set<ConfigFormat> formats;
  for (size_t at = doc.find("```json\n"); at != std::string::npos; at = doc.find("```json\n", at + 1)) {
    const size_t body = at + 8, end = doc.find("```", body);
    REQUIRE(end != std::string::npos);
    const std::string block = doc.substr(body, end - body);
    CAPTURE(block);
    formats.insert(parse_engine_config(block, "docs/config.md").format);
  }
  CHECK(formats.size() == 2);
}

TEST_CASE("docs/config.md's DeepSpeed table names keys the parser knows") {
  const std::string doc = read_text("docs/config.md");
  const std::vector<std::string> rows = table_keys(doc, "## DeepSpeed's format: the mapping");
  CHECK(rows.size() > 30);
  for (const std::string& row : rows) {
    // A row's key is a dotted path; a config with only that key must not fail as an unknown key.
    CAPTURE(row);
    json j = json::object();
    json* at = &j;
    std::string rest = row;
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
      at = &(*at)[rest.substr(0, dot)];
    }
    (*at)[rest] = nullptr;  // a value of the wrong type: the error must be about the value, not the key
    if (!j.contains("zero_optimization")) j["zero_optimization"] = json::object();
    // The keys whose absence is an error of its own, which would hide an unknown sibling.
    if (j.contains("optimizer") && row != "optimizer.type") j["optimizer"]["type"] = "AdamW";
    for (const char* offload : {"offload_optimizer", "offload_param"}) {
      json& z = j["zero_optimization"];
      if (z.contains(offload) && row != std::string("zero_optimization.") + offload + ".device") {
        z[offload]["device"] = "cpu";
      }
    }
    CHECK(!contains(ds_error(j.dump()), "unknown key"));
  }
}

}  // namespace zero
