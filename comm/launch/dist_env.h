#pragma once
// Environment-based initialization: who am I (rank, world size, local rank) and where is the
// rendezvous store, read from the variables a launcher sets (docs/launcher.md).
//
// Sources, first match wins:
//   "torchrun": RANK / WORLD_SIZE set (torchrun, zerorun). Also LOCAL_RANK, LOCAL_WORLD_SIZE
//               (default: one node), MASTER_ADDR and MASTER_PORT (required when WORLD_SIZE > 1).
//   "openmpi":  OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE; MASTER_ADDR and
//               MASTER_PORT required when the size is > 1. Checked before Slurm because mpirun inside
//               a Slurm allocation leaves its daemons' SLURM_PROCID in every rank's environment.
//   "slurm":    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; tasks on this node from
//               SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE ("2(x3),1") with SLURM_NODEID, else
//               SLURM_NTASKS / SLURM_NNODES; master = MASTER_ADDR or the first host of
//               SLURM_STEP_NODELIST / SLURM_JOB_NODELIST ("node[03-05,07]" -> "node03"); port =
//               MASTER_PORT or 29500 + SLURM_JOB_ID % 1000.
//   "default":  none of the above: a single process (world size 1).
// ZERO_JOB_TOKEN is the job token in every case. Bad values throw InvalidArgument naming the variable
// and its value.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/store/store.h"

namespace zero::comm {

struct DistEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  // The node this rank runs on, the same in every attempt of an elastic job: zerorun's --node-rank
  // (ZERO_NODE_RANK), else torchrun's GROUP_RANK, SLURM_NODEID, or rank / local_world_size.
  int node = 0;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 0;
  std::string token;   // ZERO_JOB_TOKEN
  std::string source;  // "torchrun", "slurm", "openmpi", or "default" (single process)
  // ZERO_STORE_IN_LAUNCHER=1 (zerorun): the launcher hosts the rendezvous store at
  // master_addr:master_port, so rank 0 connects to it as every other rank does and its death loses
  // no rendezvous. Otherwise (torchrun, Slurm, mpirun) rank 0 hosts it.
  bool store_in_launcher = false;
  // ZERO_STORE_PREFIX: the key prefix of this attempt of the job in the launcher's store, which
  // outlives the attempts ("attempt1"); empty: none.
  std::string store_prefix;
  // zerorun --max-restarts (docs/reliability.md): which attempt of the job this is (ZERO_RESTART_COUNT,
  // 0 for the first), and, from the second on, when the launcher saw the failure that ended the last
  // one (ZERO_RESTART_FAILED_AT, seconds since the epoch with a fraction; 0 for the first) and what
  // it was (ZERO_RESTART_REASON: "rank 3 was killed by signal 9 (SIGKILL)").
  int restart_count = 0;
  // The world the job was launched at (ZERO_FIRST_WORLD_SIZE; world_size when unset): the world its
  // layout was planned for, which a restart's smaller world shrinks from (layout/shrink.h).
  int first_world_size = 1;
  double restart_failed_at = 0;
  std::string restart_reason;
  // ZERO_HEARTBEAT_FD: a pipe to the launcher that init_process_group beats into every
  // ZERO_HEARTBEAT_INTERVAL_MS (comm/launch/heartbeat.h); -1 when the launcher watches no heartbeat.
  int heartbeat_fd = -1;
  int heartbeat_interval_ms = 0;
};

DistEnv read_dist_env();

// The rendezvous store of the job. World size 1: an in-process MemoryStore. Otherwise the ranks
// connect to master_addr:master_port, retrying until `timeout` (TimeoutError naming the address):
// to the launcher's store (store_in_launcher), or to the TcpStoreServer rank 0 hosts there and
// connects to as a client too (rank 0's process must then outlive the others' use of the store).
// Call it once per process and share the store (PrefixStore gives each user its own key space). With
// store_prefix the store returned is that prefix's view.
std::shared_ptr<Store> connect_store(const DistEnv& env, std::chrono::milliseconds timeout);

// Exposed for tests.
// First host of a Slurm node list: "node[03-05,07],gpu1" -> "node03", "a[1-2]-ib" -> "a1-ib".
std::string slurm_first_host(const std::string& nodelist);
// Tasks on node `node_id` from a Slurm tasks-per-node list: "2(x3),1" with node 3 -> 1.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id);

}  // namespace zero::comm
