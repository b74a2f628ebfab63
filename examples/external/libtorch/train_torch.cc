// A LibTorch loop outside the tree whose optimizer is the installed library's engine
// (zero::libtorch::TorchEngine): a torch::nn::Sequential, autograd and cross-entropy as LibTorch
// has them; the engine shards and updates the parameters.
//
//   zerorun --nproc-per-node 2 -- ./train_torch --stage 3 --steps 20
#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <string>

#include "adapters/libtorch/torch_engine.h"
#include "base/check.h"
#include "comm/launch/process_group.h"
#include "zero/engine.h"

namespace {

int run(int argc, char** argv) {
  int stage = 3, steps = 20, batch = 32;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    int* target = name == "--stage" ? &stage : name == "--steps" ? &steps : name == "--batch" ? &batch : nullptr;
    if (target == nullptr || i + 1 == argc) ZERO_THROW(zero::InvalidArgument, "usage: train_torch [--stage S] [--steps N] [--batch B]");
    *target = std::stoi(argv[++i]);
  }
  zero::comm::ProcessGroup pg = zero::comm::init_process_group();
  const int rank = pg.host->rank(), world = pg.host->size();
  if (batch % world != 0) ZERO_THROW(zero::InvalidArgument, "--batch {} is not divisible by the world size {}", batch, world);
  const int64_t local = batch / world;

  // Each child is a unit (what stage 3 gathers at once); finalize() broadcasts rank 0's values.
  torch::manual_seed(static_cast<uint64_t>(1 + rank));
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                              torch::nn::ReLU(), torch::nn::Linear(64, 4));
  zero::EngineOptions options;
  options.stage = stage;
  options.optimizer.kind = zero::optim::OptimizerKind::kAdamW;
  options.optimizer.groups = {zero::optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
  zero::Engine engine(*pg.host, options);
  zero::libtorch::TorchEngine zt(engine, *model);
  zt.finalize();

  torch::manual_seed(42);
  const torch::Tensor teacher = torch::randn({16, 4});
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(1000 + static_cast<uint64_t>(step));  // the step's global batch; this rank takes its slice
    const torch::Tensor x = torch::randn({batch, 16}).narrow(0, rank * local, local);
    torch::Tensor loss = torch::nn::functional::cross_entropy(zt.forward(model, x), x.matmul(teacher).argmax(1));
    zt.backward(loss);
    zt.step();
    double value = loss.item<double>();
    pg.host->all_reduce(&value, 1, zero::DType::kFloat64, zero::comm::ReduceOp::kAvg)->wait();
    if (rank == 0) std::printf("step %3d  loss %.6f\n", step + 1, value);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_torch: %s\n", e.what());
    return 1;
  }
}
