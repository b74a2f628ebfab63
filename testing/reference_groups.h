#pragma once
// A PyTorch reference file's parameter group as the engine's optim::Hyper (the reference scripts'
// format: scripts/gpt_optimizer_reference.py, scripts/mlp_optimizer_reference.py). A group names its
// rule ("kind": adamw, muon, adafactor; AdamW when absent) and its settings; what it leaves out comes
// from `defaults` (the AdamW references keep lr, betas and eps beside the groups). Its "names" become
// the group's name patterns (exact names), so the file decides which tensor goes where.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "optim/optimizer.h"

namespace zero::testing {

inline optim::Hyper reference_group(const nlohmann::json& group, const nlohmann::json& defaults) {
  auto number = [&](const char* key) {
    return group.contains(key) ? group[key].get<float>() : defaults.at(key).get<float>();
  };
  optim::Hyper h;
  h.kind = optim::parse_optimizer(group.value("kind", std::string("adamw")));
  h.lr = number("lr");
  h.weight_decay = group.at("weight_decay").get<float>();
  switch (*h.kind) {
    case optim::OptimizerKind::kAdamW: {
      const nlohmann::json& betas = group.contains("betas") ? group["betas"] : defaults.at("betas");
      h.beta1 = betas.at(0).get<float>();
      h.beta2 = betas.at(1).get<float>();
      h.eps = number("eps");
      break;
    }
    case optim::OptimizerKind::kMuon:
      h.muon = {.momentum = group.at("momentum").get<float>(), .nesterov = group.at("nesterov").get<bool>(),
                .rms_scale = group.at("rms_scale").get<float>()};
      break;
    case optim::OptimizerKind::kAdafactor:
      h.adafactor = {.eps1 = group.at("eps1").get<float>(), .eps2 = group.at("eps2").get<float>(),
                     .clip_threshold = group.at("clip_threshold").get<float>(),
                     .decay_rate = group.at("decay_rate").get<float>(),
                     .relative_step = group.at("relative_step").get<bool>(), .beta1 = group.value("beta1", 0.0f)};
      break;
    default:
      ZERO_THROW(InvalidArgument, "param_groups: kind '{}' has no reader here", group.at("kind").get<std::string>());
  }
  if (group.contains("names")) h.params = group["names"].get<std::vector<std::string>>();
  return h;
}

}  // namespace zero::testing
