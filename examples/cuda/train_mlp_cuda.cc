// Trains the examples' MLP on GPUs (cuBLAS and the engine on CUDA + NCCL), one GPU per rank:
//
//   bazel build --config=cuda //examples/cuda:train_mlp_cuda
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/cuda/train_mlp_cuda --stage 3
//   bazel-bin/examples/cuda/train_mlp_cuda --stages 0,1,2,3       (one process: a step-time table)
//
// Prints the loss and the step time per step (rank 0) and the memory report. --stages trains once
// per stage in one process on GPU 0 (world size 1) and prints a table of the mean step time after
// the first three steps: what scripts/gpu_check.sh reports. Without a GPU (or in a CPU build) it
// says so and exits 1.
#include <cstdio>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "comm/launch/process_group.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/store/memory_store.h"
#include "examples/cuda/train_loop.h"
#include "tools/cli/flags.h"

namespace {

using namespace zero;

int run(int argc, char** argv) {
#if !ZERO_WITH_CUDA
  (void)argc;
  (void)argv;
  ZERO_THROW(InvalidArgument, "a CPU build: build with --config=cuda and run where a GPU is visible");
#else
  cli::Flags flags(argc, argv);
  examples::cuda::CudaMlpRun r;
  r.steps = flags.get_int("steps", 30);
  r.global_batch = flags.get_int("batch", 64);
  const int hidden = flags.get_int("hidden", 256);
  r.widths = {flags.get_int("inputs", 64), hidden, hidden, flags.get_int("classes", 10)};
  r.seed = flags.get_int("seed", 1);
  const int micro = flags.get_int("micro", 1);
  const int stage = flags.get_int("stage", 2);
  const std::vector<std::string> stages = flags.has("stages") ? flags.get_list("stages", "") : std::vector<std::string>{};
  flags.check_all_used();
  if (!comm::nccl_available()) {
    ZERO_THROW(InvalidArgument, "no GPU or no NCCL in this build: build with --config=cuda and run where a GPU is visible");
  }

  if (!stages.empty()) {
    // The table: one process, GPU 0, world size 1.
    std::printf("| stage | steps | mean step (ms, after the first 3) | last loss |\n| --- | --- | --- | --- |\n");
    for (const std::string& s : stages) {
      const int st = std::stoi(s);
      auto nccl = comm::make_nccl_communicator(std::make_shared<comm::MemoryStore>(), 0, 1, {.device = 0});
      auto gloo = comm::make_gloo_communicator(std::make_shared<comm::MemoryStore>(), 0, 1);
      double total = 0, last = 0;
      int timed = 0;
      examples::cuda::train_cuda_mlp(*nccl, *gloo, examples::cuda::cuda_mlp_options(st, micro), r, [&](const examples::cuda::CudaMlpStep& x) {
        if (x.step > 3) {
          total += x.seconds;
          ++timed;
        }
        last = x.loss;
      });
      std::printf("| %d | %d | %.3f | %.6f |\n", st, r.steps, timed ? 1e3 * total / timed : 0.0, last);
    }
    return 0;
  }

  comm::ProcessGroupOptions pgo;
  pgo.backend = "nccl";
  comm::ProcessGroup pg = comm::init_process_group(pgo);
  r.device = pg.env.local_rank % comm::cuda_device_count();
  const int rank = pg.host->rank();
  if (rank == 0) {
    std::printf("training MLP %d-%d-%d-%d on %d GPU rank(s), stage %d\n", r.widths[0], r.widths[1], r.widths[2],
                r.widths[3], pg.host->size(), stage);
  }
  const MemoryReport report =
      examples::cuda::train_cuda_mlp(*pg.device, *pg.host, examples::cuda::cuda_mlp_options(stage, micro), r, [&](const examples::cuda::CudaMlpStep& x) {
        if (rank == 0) std::printf("step %3d  loss %.6f  grad_norm %.4f  %.2f ms\n", x.step, x.loss, x.grad_norm, 1e3 * x.seconds);
      });
  pg.host->barrier()->wait();
  std::printf("%s", report.table().c_str());
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("train_mlp_cuda", run, argc, argv); }
