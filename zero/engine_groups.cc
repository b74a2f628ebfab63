#include "zero/engine_groups.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/check.h"
#include "optim/custom_optimizer.h"
#include "zero/collective_order.h"
#include "zero/rank_agreement.h"

namespace zero {

void bind_groups(const EngineComms& comms, memory::Device& device, std::chrono::milliseconds timeout) {
  for (comm::Communicator* c : {comms.shard, comms.replica, comms.model_parallel}) {
    if (c != nullptr) CollectiveOrder check(device, *c, timeout);
  }
  for (const auto& f : comms.finalizers) {
    if (f == nullptr) ZERO_THROW(InvalidArgument, "EngineComms.finalizers holds a null finalizer");
    // The finalizer's group splits the model: the norm must be added over at least its ranks.
    const int group = f->group()->size();
    if (group > 1 && (comms.model_parallel == nullptr || comms.model_parallel->size() < group)) {
      ZERO_THROW(InvalidArgument,
                 "the {} gradient finalizer works over {} ranks but the norm group (EngineComms.model_parallel) is {}: "
                 "each rank would clip by the norm of its own part; build the engine's groups from the mesh "
                 "(parallel::engine_comms)",
                 f->name(), group, comms.model_parallel ? fmt::format("{} rank(s)", comms.model_parallel->size()) : "null");
    }
    f->bind(device, timeout);
  }
}

comm::Communicator* split_group(const EngineComms& comms) {
  for (const auto& f : comms.finalizers) {
    if (f->splits_over() != nullptr) return f->splits_over();
  }
  return nullptr;
}

void check_claimed(const GradFinalizers& finalizers, ParamRegistry& registry) {
  for (const ParamSpec& p : registry.params()) {
    const std::string need = needs_finalizer(p);
    if (need.empty()) continue;
    if (std::none_of(finalizers.begin(), finalizers.end(), [&](const auto& f) { return f->claims(p); })) {
      registry.note_error(fmt::format("parameter '{}' is {} but no gradient finalizer of the engine takes it "
                                      "(EngineComms.finalizers): build the engine's groups from the mesh "
                                      "(parallel::engine_comms)",
                                      p.name, need));
      return;
    }
  }
}

void check_whole_tensor_rule(const EngineOptions& options, const GradFinalizers& finalizers, ParamRegistry& registry) {
  const auto& rule = options.optimizer.custom;
  if (!rule || !rule->needs_whole_tensors()) return;
  for (const ParamSpec& p : registry.params()) {
    for (const auto& f : finalizers) {
      const comm::Communicator* across = f->splits_over();
      if (across == nullptr || across->size() == 1 || !f->claims(p) || f->copies(p) || f->split(p).gather) continue;
      registry.note_error(fmt::format("optimizer '{}' needs whole tensors but parameter '{}' is split across the {} "
                                      "ranks of the {} finalizer: each rank would update its slice as if it were "
                                      "the tensor",
                                      rule->name(), p.name, across->size(), f->name()));
      return;
    }
  }
}

void check_groups_agree(const EngineComms& comms, ParamRegistry& registry,
                        const std::vector<std::pair<std::string, std::string>>& fingerprint, memory::Device& device,
                        std::chrono::milliseconds timeout) {
  std::vector<AgreementEntry> fp;
  for (const auto& [field, value] : fingerprint) fp.push_back({field, value});
  // The mesh: every rank of every group must see the same group sizes.
  auto size_of = [](const comm::Communicator* c) { return std::to_string(c ? c->size() : 1); };
  std::vector<comm::Communicator*> groups{comms.shard, comms.replica};
  for (const auto& f : comms.finalizers) {
    if (!f->same_registration()) continue;
    fp.push_back({f->name() + " group size", size_of(f->group())});
    // (A group of one rank, which split placements need even at tp 1, has no one to disagree with.)
    if (f->group() != nullptr && f->group()->size() > 1) groups.push_back(f->group());
  }
  fp.push_back({"model-parallel group size", size_of(comms.model_parallel)});
  for (comm::Communicator* c : groups) {
    if (c == nullptr) continue;
    registry.verify_across_ranks(*c, timeout, &device);
    check_agreement(*c, {.what = "engine options", .verb = "has"}, fp, "", timeout, &device);
  }
}

void broadcast_initial_values(const EngineComms& comms, const ParamRegistry& registry, memory::Device& device,
                              std::chrono::milliseconds timeout) {
  // The parameters were written on the compute stream.
  memory::Stream& compute = device.compute_stream();
  for (comm::Communicator* c : {comms.shard, comms.replica}) {
    if (c == nullptr) continue;
    CollectiveOrder order(device, *c, timeout);
    for (const ParamSpec& p : registry.params()) {
      order.before_issue(compute);
      order.after(*c->broadcast(p.data.ptr, p.data.numel, p.dtype, 0), compute);
    }
  }
}

void verify_group_schedules(const EngineComms& comms) {
  std::vector<comm::Communicator*> groups{comms.shard, comms.replica};
  for (const auto& f : comms.finalizers) groups.push_back(f->group());
  groups.push_back(comms.model_parallel);
  std::vector<comm::Communicator*> verified;
  for (comm::Communicator* c : groups) {
    if (c == nullptr || std::find(verified.begin(), verified.end(), c) != verified.end()) continue;
    c->verify_schedule();
    verified.push_back(c);
  }
}

}  // namespace zero
