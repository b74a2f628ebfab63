#pragma once
// The examples' optimizer groups: 0 the decayed weights, 1 the rest (no weight decay), and, with
// --optimizer muon, 2 Muon for the hidden matrices (Moonlight's hybrid, arXiv 2502.16982: the
// embeddings, the head, the norms and the biases stay with AdamW in groups 0 and 1).
#include "optim/optimizer.h"
#include "zero/engine_options.h"

namespace zero::examples {

inline constexpr int kMuonGroup = 2;

inline bool has_muon_group(const EngineOptions& o) {
  return !o.optimizer.custom && o.optimizer.groups.size() > kMuonGroup &&
         optim::group_kind(o.optimizer, kMuonGroup) == optim::OptimizerKind::kMuon;
}

// The group of a parameter that decays or not and is a hidden matrix or not.
inline int example_group(const EngineOptions& o, bool decay, bool hidden_matrix) {
  if (hidden_matrix && has_muon_group(o)) return kMuonGroup;
  return decay ? 0 : 1;
}

// --optimizer muon on top of the two AdamW groups: a third, Muon, with group 0's learning rate and
// weight decay (Muon's update is scaled to AdamW's RMS, so the same values fit; docs/optim.md).
inline void add_muon_group(EngineOptions& o) {
  o.optimizer.kind = optim::OptimizerKind::kAdamW;
  optim::Hyper muon = o.optimizer.groups.at(0);
  muon.kind = optim::OptimizerKind::kMuon;
  o.optimizer.groups.resize(kMuonGroup);
  o.optimizer.groups.push_back(muon);
}

}  // namespace zero::examples
