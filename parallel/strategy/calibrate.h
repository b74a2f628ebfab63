#pragma once
// Measuring a machine for the strategy planner: the parts of a cluster file (cluster.h) that do not
// depend on the model. tools/plan/calibrate_cluster writes them alone (a model's compute is then
// priced from its FLOPs at the measured GEMM rate); a model's own calibration program
// (examples/gpt/calibrate_gpt for the GPT) adds its kernels' times under its description's keys
// (kernel_times.h). Every rank of the launched job calls calibrate_machine; they measure together.
//
//   intra / inter   the ring model fitted to all-reduces over the ranks (1 KiB .. 4 MiB) between
//                   ranks that compute (as a training step meets its collectives on shared cores;
//                   the idle fit and point-to-point between ranks 0 and 1 are reported beside it)
//   sync            the wait for the slowest rank at a collective after compute
//   optimizer_rate  parameters per second of the engine's AdamW step on one rank (all ranks at
//                   once), and host_optimizer_rate the same with the optimizer offloaded
//   copy            an all-gather over one rank (ZeRO-3 at dp 1 filling its window), fitted as a link
//   the rest        cores as devices (a CPU machine: shared_cores), MemAvailable per core, a float
//                   GEMM's rate as peak_flops (matmul efficiency 1: it is measured)
#include <chrono>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/strategy/cluster.h"

namespace zero::strategy {

struct MachineCalibration {
  Cluster cluster;      // no kernels
  std::string summary;  // what was measured and how well the fits hold, a few lines to print
};
// `repeats`: samples per measurement (their median), at least 1.
MachineCalibration calibrate_machine(comm::Communicator& world, int repeats);

// This machine's cores (at least one): its devices, which the ranks share.
int machine_cores();
// The cluster as JSON to `path`; IoError naming `flag` (where the path came from) when it cannot.
void write_cluster(const std::string& path, const Cluster& cluster, const std::string& flag);

// What a model's kernel calibration shares with the machine's: seconds since `t0`, the median of
// samples, and each value's mean over the ranks (every rank passing as many, in the same order).
double seconds_since(std::chrono::steady_clock::time_point t0);
double median(std::vector<double> samples);
std::vector<double> mean_over_ranks(comm::Communicator& world, std::vector<double> values);

}  // namespace zero::strategy
