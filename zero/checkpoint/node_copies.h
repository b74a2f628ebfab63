#pragma once
// Checkpoints held in the nodes' memory, each rank's data file also on a rank of another node (its
// buddy), so that losing a node loses no part of the checkpoint (docs/reliability.md).
//
//   node 0: /dev/shm/ckpt/node-0                 node 1: /dev/shm/ckpt/node-1
//     rank-00000.bin  (rank 0 wrote it)  ───►      rank-00000.bin  (rank 2 holds its copy)
//     rank-00001.bin  (rank 1)           ───►      rank-00001.bin  (rank 3)
//     rank-00002.bin  (rank 0 holds)     ◄───      rank-00002.bin  (rank 2 wrote it)
//     rank-00003.bin  (rank 1 holds)     ◄───      rank-00003.bin  (rank 3)
//     every rank's index, manifest.json            every rank's index, manifest.json
//
// The save (Engine::save_async with NodeCopies) writes into each node's own directory; no directory
// is seen by all ranks, as a node's /dev/shm is not. Each rank writes its files there and sends its
// data file to its buddy, the rank at its place on the next node (cyclically, in the order the
// nodes' first ranks come); every rank's index reaches every node; then each node's first rank
// writes the manifest and swaps the directory in, as rank 0 does in a shared directory. A node thus
// holds its own ranks' data files and the previous node's, 2/nodes of the checkpoint's data bytes
// (all of it on two nodes), and every index. The copies travel on their own communicator, on the
// save's thread, while training goes on.
//
// The restore (restore_node_copies) after a restart: the ranks now in the job say what their nodes
// hold, take the newest save whose data files the nodes hold between them, and copy to each node
// the files it lacks from the first node that has them (a node that lost the save whole gets its
// manifest and indexes too). Each node's directory is then a complete checkpoint that Engine::load
// reads. A save that lost a rank's data file and its copy (a node and its buddy node) is passed
// over, and named. The restore can bring a node up to the whole checkpoint's data, in its memory.
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "zero/checkpoint/latest_checkpoint.h"

namespace zero {

struct NodeCopies {
  // The engine's ranks, rank for rank (its rank is Engine::rank()), used by the saves alone: they
  // run on the save's thread beside the training's collectives. The caller keeps it alive while the
  // engine may save with it.
  comm::Communicator* comm = nullptr;
  std::vector<int> node_of_rank;  // each rank's node (any ids; the ranks of a node share one)
};

// Collective over `comm`: every rank's node, by rank.
std::vector<int> gather_nodes(comm::Communicator& comm, int node, std::chrono::milliseconds timeout);

// The first rank of `rank`'s node: it completes the node's directory.
int node_leader(const std::vector<int>& node_of_rank, int rank);
// The rank that holds a copy of `rank`'s data file: the rank at its place (modulo) on the next node;
// -1 on a single node.
int buddy_of(const std::vector<int>& node_of_rank, int rank);

// The save's part (on its thread), once this rank's index and data file are in `partial` (or it
// failed to write them: `local_error`): every index to every node, the data file to the buddy, the
// buddies' files received; an error on any rank is thrown on all, naming it.
void exchange_node_copies(const NodeCopies& copies, const std::string& partial, const std::string& local_error,
                          std::chrono::milliseconds timeout);

// Collective over `comm` (the ranks of the job now, `node_of_rank` theirs): makes this node's
// `dir` (or `dir.old`) hold the newest save that the nodes hold whole between them, copying the files
// it lacks from other nodes. The directory to load and its step; nullopt when the nodes hold no save
// whole. `passed_over` (when given) gets a line per save passed over, saying why. Every rank
// returns the same step, or the same error.
std::optional<FoundCheckpoint> restore_node_copies(comm::Communicator& comm, const std::vector<int>& node_of_rank,
                                                   const std::string& dir, std::chrono::milliseconds timeout,
                                                   std::vector<std::string>* passed_over = nullptr);

}  // namespace zero
