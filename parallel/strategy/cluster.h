#pragma once
// A cluster as the strategy planner sees it: how many devices, how much memory each has, how fast
// they compute and how fast the links between them move data. Written by hand for a cluster one
// plans for (8 x 80 GB with NVLink inside nodes), or measured on this machine by zero_calibrate,
// which also records how long the model's own kernels take at the sizes the layouts use.
//
// JSON (every field required unless marked; sizes in bytes, times in seconds, rates per second):
//   {
//     "name": "8x H100 80GB, NVLink, 400 Gb/s",
//     "devices_per_node": 8, "nodes": 1,
//     "device_memory": 85899345920,          // the device's physical memory
//     "runtime_reserve": 2147483648,          // optional: what the runtime takes before training
//                                             // does (CUDA context, NCCL's buffers); absent: 2 GiB
//     "fragmentation": 0.05,                  // optional: the share of the rest the allocator
//                                             // cannot hand out; absent: 0.05
//     "peak_flops": 9.89e14,                  // dense matrix FLOP/s per device, the model dtype's
//     "matmul_efficiency": 0.5,               // the fraction of peak_flops the model's products reach
//     "intra": {"bandwidth": 1.5e11, "latency": 5e-6},   // per rank, one direction (ring bus rate)
//     "inter": {"bandwidth": 5.0e10, "latency": 1e-5},
//     "optimizer_rate": 2e10,                 // parameters per second the optimizer step updates
//     "host_link": {"bandwidth": 2.5e10, "latency": 1e-5},  // optional: device <-> host memory (offload's
//                                             // gradients down and parameters up); absent: free
//     "host_optimizer_rate": 2e9,             // optional: the CPU optimizer's (offload); absent: optimizer_rate
//     "copy": {"bandwidth": 2e12, "latency": 5e-6},  // optional: a collective over one rank copying
//                                             // its payload into its output (ZeRO-3 over one data-
//                                             // parallel rank filling its window); absent: free
//     "shared_cores": false,                  // optional: ranks of a node share its cores (a CPU
//                                             // machine), so more ranks than devices run slower and
//                                             // communication does not overlap compute
//     "sync": {"latency": 2e-4, "fraction": 0.1},  // optional: what a synchronizing collective
//                                             // waits for the slowest rank (SyncWait); absent: nothing
//     "kernels": {"gpt/f/...": 0.0012, ...}   // optional: measured seconds by kernel key (calibrated)
//   }
// A missing field, a negative or zero count, size or rate, a fraction outside (0, 1], or an unknown
// key is an InvalidArgument naming the source and the field.
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace zero::strategy {

struct Link {
  double bandwidth = 0;  // bytes per second per rank, one direction
  double latency = 0;    // seconds per message
  // Seconds for one message of `bytes`.
  double time(double bytes) const { return latency + bytes / bandwidth; }
};

// Ranks given the same work do not finish it together (on shared cores the peers' communication
// threads and the OS take turns on the cores, and the turns differ per rank), so a collective that
// the ranks' compute waits on also waits for the slowest rank: `latency` per such synchronization,
// plus `fraction` of the compute since the previous one (the ranks drift apart in proportion to it).
// Beyond the link's own time for the collective's bytes and messages.
struct SyncWait {
  double latency = 0;   // seconds per synchronization
  double fraction = 0;  // of the compute between synchronizations, in [0, 1)
  // The waits of `syncs` synchronizations spread over `compute` seconds of compute.
  double time(double syncs, double compute) const { return syncs > 0 ? syncs * latency + fraction * compute : 0.0; }
};

// A file's defaults for the memory a run cannot use (docs/strategy.md, "Headroom", says why):
// the CUDA context with its libraries (about 1 GiB) and NCCL's buffers (per communicator, per
// peer and channel 4 MiB for the Simple protocol, 4.7 for LL128 and 0.5 for LL: about 0.3 GiB
// each for a ring's two peers over 16 channels, three communicators for dp, tp and pp), and a
// caching allocator's fragmentation.
inline constexpr double kDefaultRuntimeReserve = 2.0 * (1ull << 30);
inline constexpr double kDefaultFragmentation = 0.05;

struct Cluster {
  std::string name;
  int devices_per_node = 1, nodes = 1;
  double device_memory = 0;  // physical, per device
  // Built in code a cluster means what it says (no reserve); a file without them gets the defaults.
  double runtime_reserve = 0;  // bytes per device the runtime holds
  double fragmentation = 0;    // of the rest, in [0, 1)
  double peak_flops = 0;
  double matmul_efficiency = 1;
  Link intra, inter;
  double optimizer_rate = 0;
  std::optional<Link> host_link;
  double host_optimizer_rate = 0;  // 0: optimizer_rate
  std::optional<Link> copy;        // absent: copies are free
  bool shared_cores = false;
  SyncWait sync;  // zero unless given or calibrated
  std::map<std::string, double> kernels;

  int devices() const { return devices_per_node * nodes; }
  // What a layout may take per device: the physical memory less the runtime's, less the share
  // fragmentation loses.
  double usable_memory() const { return (device_memory - runtime_reserve) * (1 - fragmentation); }
};

Cluster parse_cluster(std::string_view json_text, const std::string& source);
// parse_cluster of a file; IoError naming it when it cannot be read.
Cluster load_cluster(const std::string& path);
// The JSON above (parse_cluster reads it back to the same cluster).
std::string to_json(const Cluster& cluster);

}  // namespace zero::strategy
