#include "comm/launch/process_group.h"

#include "base/check.h"
#include "base/env.h"
#include "base/logging.h"
#include "comm/nccl/nccl_communicator.h"

namespace zero::comm {

void ProcessGroupOptions::validate() const {
  if (timeout.count() <= 0) {
    ZERO_THROW(InvalidArgument, "ProcessGroupOptions.timeout must be positive, got {} ms",
               timeout.count());
  }
  if (backend != "auto" && backend != "nccl" && backend != "gloo") {
    ZERO_THROW(InvalidArgument,
               "ProcessGroupOptions.backend must be \"auto\", \"nccl\" or \"gloo\", got \"{}\"",
               backend);
  }
  gloo.validate();
}

ProcessGroup init_process_group(const ProcessGroupOptions& options) {
  options.validate();
  std::string backend = options.backend;
  if (backend == "auto") {
    backend = env_string("ZERO_COMM_BACKEND", "auto");
    if (backend != "auto" && backend != "nccl" && backend != "gloo") {
      ZERO_THROW(InvalidArgument, "ZERO_COMM_BACKEND must be auto, nccl or gloo, got '{}'",
                 backend);
    }
  }

  ProcessGroup pg;
  pg.env = read_dist_env();
  set_log_rank(pg.env.rank);
  if (pg.env.heartbeat_fd >= 0) {
    pg.heartbeat = std::make_unique<Heartbeat>(pg.env.heartbeat_fd, std::chrono::milliseconds(pg.env.heartbeat_interval_ms));
  }
  pg.store = connect_store(pg.env, options.timeout);

  GlooOptions gloo = options.gloo;
  gloo.timeout = options.timeout;
  if (options.count_traffic && !gloo.traffic) gloo.traffic = std::make_shared<PeerTraffic>(pg.env.world_size);
  pg.traffic = gloo.traffic;
  pg.host = make_gloo_communicator(pg.store, pg.env.rank, pg.env.world_size, gloo);

  const bool want_nccl = backend == "nccl" || (backend == "auto" && nccl_available());
  if (want_nccl) {
    if (!nccl_available()) {
      ZERO_THROW(InvalidArgument, "backend \"nccl\" requested but {}",
                 nccl_built() ? "no CUDA device is visible"
                              : "this build has no CUDA (build with --config=cuda)");
    }
    NcclOptions nccl;
    nccl.timeout = options.timeout;
    nccl.device = pg.env.local_rank % cuda_device_count();
    pg.device = make_nccl_communicator(pg.store, pg.env.rank, pg.env.world_size, nccl);
  }
  ZERO_LOG_INFO("process group: rank {}/{} (local {}/{}, env {}), host gloo, device {}",
                pg.env.rank, pg.env.world_size, pg.env.local_rank, pg.env.local_world_size,
                pg.env.source, pg.device ? "nccl" : "none");
  return pg;
}

}  // namespace zero::comm
