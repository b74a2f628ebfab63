#pragma once
// A model's own kernels as a calibration timed them, looked up by key in a cluster file
// (Cluster::kernels). A model description that names its kernels ("kernels": "gpt/4,64,4,256,64")
// is costed from these times where the cluster has them, else from its FLOPs; a calibration program
// (examples/gpt/calibrate_gpt for the GPT) writes them under the keys below, so any model can be
// calibrated the same way by timing its three layers.
//
//   MODEL/LAYER/bB/tpT/spS/PASS           the layer's pass for B sequences on one tp rank, compute
//                                         alone (the planner adds the layer's tp collectives)
//   ...PASS+tp                            timed on a real tp group, its collectives included as a
//                                         run meets them (waits, the communicator's threads)
//   ...PASS+tp@R                          the same with R ranks on a machine whose ranks share fewer
//                                         cores than that, every tp group at once (per-core times
//                                         are derived: the planner slows compute by R / cores)
//   ...PASS+alone                         tp 1 with the other ranks idle: what a one-rank run meets
//                                         on a machine whose ranks share the cores
// LAYER is embedding, block or head; PASS f (forward), b (the backward's input part) or w (its
// weight part).
#include <optional>
#include <string>

#include "layout/layout.h"
#include "parallel/strategy/cluster.h"

namespace zero::strategy {

enum class KernelLayer { kEmbedding, kBlock, kHead };
enum class KernelPass { kForward, kInput, kWeight };
const char* kernel_layer_name(KernelLayer layer);  // "embedding", "block", "head"

struct Kernel {
  std::string model;  // the description's "kernels" prefix
  KernelLayer layer = KernelLayer::kBlock;
  KernelPass pass = KernelPass::kForward;
  int batch = 1;  // sequences per micro-batch
  int tp = 1;
  bool sequence_parallel = false;
};

std::string kernel_key(const Kernel& k);               // compute alone
std::string with_collectives_key(const Kernel& k);     // "+tp"
std::string crowded_key(const Kernel& k, int ranks);   // "+tp@R"
std::string alone_key(const Kernel& k);                // "+alone" (tp 1)

// How the cluster has one layer's three passes timed at a layout: compute alone (or not at all),
// with its tp collectives, or with them at the layout's crowding of a shared-core machine. A layer
// timed with its collectives adds none of its own to the step. Only a layer all of whose three
// passes are there counts as timed with collectives.
enum class KernelTiming { kCompute, kWithCollectives, kCrowded };
KernelTiming kernel_timing(const Cluster& cluster, const std::string& model, KernelLayer layer, int batch,
                           const Layout& layout);

// Seconds of one pass of `layer` at `layout` as the cluster has it calibrated, nullopt where it has
// no time for it (the caller costs its FLOPs). A crowded time is divided by the crowding (ranks per
// core), as the planner shares the cores itself.
std::optional<double> kernel_seconds(const Cluster& cluster, const std::string& model, KernelLayer layer,
                                     KernelPass pass, int batch, const Layout& layout);

}  // namespace zero::strategy
