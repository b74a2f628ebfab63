#pragma once
// The planner tests' cluster: one node of 8 devices with 1 TB each (nothing runs out of memory), a
// 10 GFLOP/s peak and a 1 GB/s, 10 us link, round numbers a test can compute a time from by hand.
#include "parallel/strategy/cluster.h"

namespace zero::strategy {

inline Cluster test_cluster() {
  Cluster c;
  c.name = "test";
  c.devices_per_node = 8;
  c.device_memory = 1e12;
  c.peak_flops = 1e10;
  c.intra = c.inter = {1e9, 1e-5};
  c.optimizer_rate = 1e8;
  return c;
}

}  // namespace zero::strategy
