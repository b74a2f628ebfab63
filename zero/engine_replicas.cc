// Engine::Impl's replica checks (EngineOptions::replica_check_every): which bytes the data-parallel
// replicas must hold alike, handed to compare_replicas (zero/replica_check.h) over each group that
// holds them; and the checksum stage 3's shard carries from the end of one step to the next, where
// no replica holds it.
#include <fmt/format.h>

#include <chrono>
#include <utility>
#include <thread>

#include "base/check.h"
#include "zero/engine_impl.h"
#include "zero/replica_check.h"

namespace zero {

std::vector<ReplicaPiece> Engine::Impl::shard_pieces() {
  std::vector<ReplicaPiece> pieces;
  const char* shard = static_cast<const char*>(parts.gatherer->shard());
  for (const OwnedPiece& p : parts.ownership->pieces()) {
    const DType dt = parts.layout->buckets()[p.bucket].dtype;
    pieces.push_back({fmt::format("the shard of '{}' [{}, {})", registry.param(tensor_param[p.tensor]).name,
                                  p.tensor_begin, p.tensor_end),
                      shard + parts.layout->shard_bytes(p.bucket, p.opt_offset), (p.tensor_end - p.tensor_begin) * dtype_size(dt)});
  }
  return pieces;
}

// How much later than the rank at fault the others throw. A launcher that restarts the job without
// the rank whose failure it sees first (zerorun --max-restarts) then leaves out the corrupted one,
// not a healthy rank that merely reported it sooner.
constexpr std::chrono::milliseconds kHealthyRanksLater{1000};

void Engine::Impl::agree_and_throw(std::string verdict, bool named) {
  // Each group reached its own verdict; through the groups every rank shares, all reach one.
  verdict = agree_on_verdict(*comms.shard, *device, verdict, options.timeout);
  if (comms.replica) verdict = agree_on_verdict(*comms.replica, *device, verdict, options.timeout);
  if (verdict.empty()) return;
  if (!named) std::this_thread::sleep_for(kHealthyRanksLater);
  ZERO_THROW(Error, "{}", verdict);
}

void Engine::Impl::check_replicas(int64_t step, int rank_name) {
  ReplicaVerdict verdict;
  if (parts.gatherer) {
    // The parameters live as shards, alike across the replicas of each shard (hybrid sharding);
    // what every rank of the shard group gathered for this step's forward is alike too (a copy
    // that differs was corrupted on its way or in the rank's gather window).
    std::vector<ReplicaPiece> gathered;
    std::vector<uint32_t> gathered_sums;
    for (const auto& [bucket, crc] : std::exchange(gathered_checksums, {})) {
      const ShardLayout::Bucket& b = parts.layout->buckets()[bucket];
      gathered.push_back({fmt::format("unit {}'s parameters as gathered for the forward (bucket {})", b.unit, bucket),
                          nullptr, parts.layout->bucket_bytes(bucket)});
      gathered_sums.push_back(crc);
    }
    verdict = compare_replicas(*comms.shard, *device, gathered, gathered_sums, rank_name, step,
                               comms.replica ? "shard group" : "data-parallel group", options.timeout);
    if (comms.replica) {  // every rank takes part, whatever its shard group found
      const std::vector<ReplicaPiece> pieces = shard_pieces();
      const ReplicaVerdict across =
          compare_replicas(*comms.replica, *device, pieces, replica_checksums(*device, pieces, options.timeout),
                           rank_name, step, "replica group", options.timeout);
      if (verdict.text.empty()) verdict.text = across.text;
      verdict.this_rank = verdict.this_rank || across.this_rank;
    }
  } else {
    // Every rank holds every parameter, frozen ones included; their checksums serve both groups.
    std::vector<ReplicaPiece> pieces;
    for (const ParamSpec& p : registry.params()) {
      pieces.push_back({fmt::format("parameter '{}'", p.name), p.data.ptr, p.data.numel * dtype_size(p.dtype)});
    }
    const std::vector<uint32_t> checksums = replica_checksums(*device, pieces, options.timeout);
    verdict = compare_replicas(*comms.shard, *device, pieces, checksums, rank_name, step,
                               comms.replica ? "shard group" : "data-parallel group", options.timeout);
    if (comms.replica) {  // every rank takes part, whatever its shard group found
      const ReplicaVerdict across =
          compare_replicas(*comms.replica, *device, pieces, checksums, rank_name, step, "replica group", options.timeout);
      if (verdict.text.empty()) verdict.text = across.text;
      verdict.this_rank = verdict.this_rank || across.this_rank;
    }
  }
  agree_and_throw(verdict.text, verdict.this_rank);
}

void Engine::Impl::record_gathered(size_t bucket, const void* data) {
  for (const auto& [b, crc] : gathered_checksums) {
    if (b == bucket) return;  // the step's first gather of it (micro-batches gather it again)
  }
  const ReplicaPiece piece{"", data, parts.layout->bucket_bytes(bucket)};
  gathered_checksums.emplace_back(bucket, replica_checksums(*device, {piece}, options.timeout).front());
}

void Engine::Impl::record_shard_at_rest() {
  const std::vector<ReplicaPiece> pieces = shard_pieces();
  shard_checksums = replica_checksums(*device, pieces, options.timeout);
  shard_checksums_recorded = true;
}

void Engine::Impl::verify_shard_at_rest(int64_t step, int rank_name) {
  std::string verdict;
  const std::vector<ReplicaPiece> pieces = shard_pieces();
  const std::vector<uint32_t> now = replica_checksums(*device, pieces, options.timeout);
  ZERO_CHECK(now.size() == shard_checksums.size(), "the shard's pieces changed between two steps");
  for (size_t k = 0; k < pieces.size() && verdict.empty(); ++k) {
    if (now[k] == shard_checksums[k]) continue;
    verdict = fmt::format(
        "{} on rank {} changed at rest between step {} and step {} (CRC32C {:08x} at the end of step {}, {:08x} now): "
        "its memory was corrupted",
        pieces[k].name, rank_name, step - 1, step, shard_checksums[k], step - 1, now[k]);
  }
  shard_checksums.clear();
  shard_checksums_recorded = false;
  agree_and_throw(verdict, !verdict.empty());
}

}  // namespace zero
