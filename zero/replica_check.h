#pragma once
// The check that data-parallel replicas still hold the same bits (EngineOptions::replica_check_every,
// docs/reliability.md). Silent data corruption, a bit that flips in one replica's memory or in its
// arithmetic, leaves no error behind: the replica trains on, its copy of the model drifts from the
// others', and a later checkpoint carries whichever copy rank 0 holds. Every K steps each rank
// sends a CRC32C of every piece it must hold alike with its peers (the same bytes, whatever the
// data each saw), and every rank reaches the same verdict: a piece whose checksums disagree is named
// with the ranks outside the majority and the step, on every rank, so that none is left waiting.
//
// What must be alike, by stage (one rule here; the stage policy says which pieces a rank holds):
//   stages 0-2: every trainable parameter, over the shard group, and under hybrid sharding over the
//               replica group too (the copies every rank gathers back after the update);
//   stage 3:    each unit as gathered for the checked step's forward, over the shard group (every
//               rank gathers the same bytes: a copy that differs was corrupted on its way or in
//               the rank's window); the parameter shard, over the replica group (hybrid sharding's
//               replicas of one shard); and, replicas or not, against the checksum it carried from
//               the end of the step before (memory corrupted at rest, which no peer could see).
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "memory/device.h"

namespace zero {

// Bytes on the engine's device that every rank of a group must hold alike.
struct ReplicaPiece {
  std::string name;  // "parameter 'fc1.weight'", "shard of 'fc1.weight' [64, 128)"
  const void* data = nullptr;
  size_t bytes = 0;
};

// The CRC32C of each piece (read through host staging where the device's memory is not the host's),
// after the device's compute stream has finished writing them.
std::vector<uint32_t> replica_checksums(memory::Device& device, const std::vector<ReplicaPiece>& pieces,
                                        std::chrono::milliseconds timeout);

// Collective over `comm`, whose ranks hold the same pieces in the same order. `rank_name` is this
// rank as errors name it (the engine's rank); `group` names the group ("data-parallel group",
// "replica group"). Returns the same text on every rank of `comm`, empty when every piece agrees, and
// whether this rank is one named:
//   "replicas disagree after step 12 in the data-parallel group: parameter 'fc1.weight' on rank 2
//    differs from ranks 0, 1, 3 (CRC32C 5a1c... against 9e02...)"
// or, where no checksum has a majority (2 ranks), "... differs with no majority: rank 0 CRC32C ...,
// rank 1 CRC32C ...", with every such piece (at most 8 listed, then their count). A group of 1 rank
// compares nothing.
struct ReplicaVerdict {
  std::string text;        // empty: every piece agrees
  bool this_rank = false;  // this rank is outside the majority of some piece (or in a split with none)
};
// `checksums`: replica_checksums(pieces), computed once for every group the pieces are compared over.
ReplicaVerdict compare_replicas(comm::Communicator& comm, memory::Device& device, const std::vector<ReplicaPiece>& pieces,
                                const std::vector<uint32_t>& checksums, int rank_name, int64_t step,
                                const std::string& group, std::chrono::milliseconds timeout);

// Collective over `comm`: the first non-empty verdict of its ranks (this rank's own when it has one),
// so that a verdict reached in one group reaches the ranks of the others through the groups they
// share, and every rank stops together.
std::string agree_on_verdict(comm::Communicator& comm, memory::Device& device, const std::string& verdict,
                             std::chrono::milliseconds timeout);

}  // namespace zero
