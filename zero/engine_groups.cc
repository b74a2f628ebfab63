#include "zero/engine_groups.h"

#include <algorithm>

#include "zero/collective_order.h"
#include "zero/rank_agreement.h"
#include "zero/tp_replica_check.h"

namespace zero {

void check_group_pairing(const EngineComms& comms, memory::Device& device, std::chrono::milliseconds timeout) {
  for (comm::Communicator* c : {comms.shard, comms.replica, comms.tp, comms.model_parallel}) {
    if (c != nullptr) CollectiveOrder check(device, *c, timeout);
  }
}

void check_groups_agree(const EngineComms& comms, ParamRegistry& registry,
                        const std::vector<std::pair<std::string, std::string>>& fingerprint, memory::Device& device,
                        std::chrono::milliseconds timeout) {
  std::vector<AgreementEntry> fp;
  for (const auto& [field, value] : fingerprint) fp.push_back({field, value});
  // The mesh: every rank of every group must see the same group sizes.
  auto size_of = [](const comm::Communicator* c) { return std::to_string(c ? c->size() : 1); };
  fp.push_back({"tensor-parallel group size", size_of(comms.tp)});
  fp.push_back({"model-parallel group size", size_of(comms.model_parallel ? comms.model_parallel : comms.tp)});
  // (A tp group of one rank, which split placements need even at tp 1, has no one to disagree with.)
  for (comm::Communicator* c : {comms.shard, comms.replica, comms.tp}) {
    if (c == nullptr || (c == comms.tp && c->size() == 1)) continue;
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
  if (comms.tp != nullptr) check_tp_replicas(*comms.tp, registry, device, timeout);
}

void verify_group_schedules(const EngineComms& comms) {
  std::vector<comm::Communicator*> verified;
  for (comm::Communicator* c : {comms.shard, comms.replica, comms.tp, comms.model_parallel, comms.tied}) {
    if (c == nullptr || std::find(verified.begin(), verified.end(), c) != verified.end()) continue;
    c->verify_schedule();
    verified.push_back(c);
  }
}

}  // namespace zero
