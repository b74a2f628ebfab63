#pragma once
// One call that turns a launched process into a member of the job: reads the launcher's environment
// (comm/launch/dist_env.h), connects the rendezvous store, and builds the communicators.
//
//   comm::ProcessGroup pg = comm::init_process_group();
//   pg.host->all_reduce(...);            // Gloo, host buffers, always present
//   if (pg.device) pg.device->...;       // NCCL, device buffers, when available
//
// The device communicator: backend "auto" uses NCCL when the build has CUDA and a GPU is visible
// (device = local_rank % device count), else none; "nccl" requires it; "gloo" never builds one.
// The environment variable ZERO_COMM_BACKEND overrides "auto" (only). Sets the log rank. Starts the
// heartbeat the launcher asks for (comm/launch/heartbeat.h) before anything that may wait.
#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/launch/dist_env.h"
#include "comm/launch/heartbeat.h"
#include "comm/store/store.h"

namespace zero::comm {

struct ProcessGroupOptions {
  // Store connection, communicator rendezvous, and default collective waits.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // "auto", "nccl" or "gloo" (see above).
  std::string backend = "auto";
  // Host communicator settings (its timeout is replaced by `timeout`).
  GlooOptions gloo;
  // Count the bytes the host communicator (and its splits) send to each rank (ProcessGroup::traffic).
  bool count_traffic = true;

  void validate() const;
};

struct ProcessGroup {
  DistEnv env;
  std::shared_ptr<Store> store;
  std::unique_ptr<Communicator> host;
  std::unique_ptr<Communicator> device;  // may be null
  // The host communicator's bytes sent to each world rank (comm/peer_traffic.h); null when not
  // counted.
  std::shared_ptr<PeerTraffic> traffic;
  // Beating to the launcher while the group lives, when it asked (ZERO_HEARTBEAT_FD); else null.
  std::unique_ptr<Heartbeat> heartbeat;
};

ProcessGroup init_process_group(const ProcessGroupOptions& options = {});

}  // namespace zero::comm
