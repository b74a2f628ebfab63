// Engine::Impl::check_replicas: which bytes the data-parallel replicas must hold alike, handed to
// compare_replicas (zero/replica_check.h) over each group that holds them.
#include <fmt/format.h>

#include "zero/engine_impl.h"
#include "zero/replica_check.h"

namespace zero {

void Engine::Impl::check_replicas(int64_t step, int rank_name) {
  std::vector<ReplicaPiece> pieces;
  std::string verdict;
  if (parts.gatherer) {
    // The parameters live as shards: alike across the replicas of each shard (hybrid sharding) only.
    if (!comms.replica) return;
    const char* shard = static_cast<const char*>(parts.gatherer->shard());
    for (const OwnedPiece& p : parts.ownership->pieces()) {
      const DType dt = parts.layout->buckets()[p.bucket].dtype;
      pieces.push_back({fmt::format("the shard of '{}' [{}, {})", registry.param(tensor_param[p.tensor]).name,
                                    p.tensor_begin, p.tensor_end),
                        shard + parts.layout->shard_bytes(p.bucket, p.opt_offset), (p.tensor_end - p.tensor_begin) * dtype_size(dt)});
    }
    verdict = compare_replicas(*comms.replica, *device, pieces, rank_name, step, "replica group", options.timeout);
  } else {
    // Every rank holds every parameter, frozen ones included.
    for (const ParamSpec& p : registry.params()) {
      pieces.push_back({fmt::format("parameter '{}'", p.name), p.data.ptr, p.data.numel * dtype_size(p.dtype)});
    }
    verdict = compare_replicas(*comms.shard, *device, pieces, rank_name, step,
                               comms.replica ? "shard group" : "data-parallel group", options.timeout);
    if (comms.replica) {  // every rank takes part, whatever its shard group found
      const std::string across =
          compare_replicas(*comms.replica, *device, pieces, rank_name, step, "replica group", options.timeout);
      if (verdict.empty()) verdict = across;
    }
  }
  // Each group reached its own verdict; through the groups every rank shares, all reach one.
  if (comms.replica) {
    verdict = agree_on_verdict(*comms.shard, *device, verdict, options.timeout);
    verdict = agree_on_verdict(*comms.replica, *device, verdict, options.timeout);
  }
  if (!verdict.empty()) ZERO_THROW(Error, "{}", verdict);
}

}  // namespace zero
