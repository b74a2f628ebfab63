// Trains an MLP on synthetic data with the sharded engine, on as many ranks as the launcher starts:
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/train_mlp --stage 3
//
// Prints the global loss per step (rank 0) and every rank's memory report at the end. Each rank
// trains on its own slice of every global batch; the engine averages the gradients. Checkpoints:
// --save DIR [--save-every K], --resume DIR (any world size and stage), --export FILE.safetensors.
// --config FILE: the engine options, batch and log interval from a JSON file, ours or a DeepSpeed
// config (docs/config.md); flags given explicitly override it. --shard-group-size N: hybrid sharding
// (shard groups of N consecutive ranks, replicated across groups).
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>

#include "base/logging.h"
#include "base/check.h"
#include "comm/launch/process_group.h"
#include "tools/cli/flags.h"
#include "examples/layout_flags.h"
#include "examples/run_flags.h"
#include "examples/mlp.h"
#include "examples/mlp_engine.h"
#include "zero/engine.h"

namespace {

// The example's options without --config (each flag still overrides them).
zero::EngineOptions mlp_defaults() {
  using namespace zero;
  EngineOptions o;
  o.stage = 2;
  o.optimizer.kind = optim::OptimizerKind::kAdamW;
  o.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f},
                        optim::Hyper{.lr = 1e-2f, .weight_decay = 0.0f}};
  o.max_grad_norm = 1.0f;
  o.layout.bucket_numel = 256 * 1024 / sizeof(float);
  return o;
}

int run(int argc, char** argv) {
  using namespace zero;
  cli::Flags flags(argc, argv);
  const examples::ConfigFlag config = examples::ConfigFlag::read(flags);
  const int steps = flags.get_int("steps", 30);
  // Samples of one micro-step over all ranks (a config's global batch divided by the micro-steps).
  const bool batch_given = flags.has("batch");
  const int batch_flag = flags.get_int("batch", 64);
  const int hidden = flags.get_int("hidden", 256);
  const int inputs = flags.get_int("inputs", 64);
  const int classes = flags.get_int("classes", 10);
  EngineOptions opt = examples::zero_flags(flags, config.engine_options(flags, mlp_defaults(), "train_mlp"));
  if (flags.has("bucket-kib")) {
    opt.layout.bucket_numel = static_cast<size_t>(flags.get_int("bucket-kib", 256)) * 1024 / sizeof(float);
  }
  const int log_every = config.log_every(flags);
  const int seed = flags.get_int("seed", 1);
  const examples::RunFlags run_flags = examples::RunFlags::read(flags);
  const examples::HybridFlag hybrid = examples::HybridFlag::read(flags, config, opt);
  flags.check_all_used();
  if (config.model_dtype() && *config.model_dtype() != DType::kFloat32) {
    ZERO_THROW(InvalidArgument, "the MLP trains in fp32; {} sets model_dtype {}", config.config->source,
               dtype_name(*config.model_dtype()));
  }
  const bool infer_micro = config.config && config.config->loop.infer_micro_batches && !flags.has("micro-steps");

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& comm = *pg.host;
  const int rank = comm.rank(), world = comm.size();
  config.print(rank);
  // DeepSpeed's batch sizes without gradient_accumulation_steps: the micro-steps from the world.
  if (infer_micro) opt.micro_batches = resolve_micro_batches(*config.config, world);
  const int micro = opt.micro_batches;
  const std::optional<int> config_batch = config.global_batch(micro, world);
  const int global_batch = batch_given || !config_batch ? batch_flag : *config_batch / micro;
  if (global_batch % world != 0) {
    ZERO_THROW(InvalidArgument, "--batch {} is not divisible by the world size {}", global_batch, world);
  }
  const int local_batch = global_batch / world;

  // Different seeds per rank on purpose: finalize() broadcasts rank 0's initial values.
  examples::Mlp model({inputs, hidden, hidden, classes}, static_cast<uint64_t>(seed + 17 * rank));
  examples::SyntheticData data(inputs, classes, static_cast<uint64_t>(seed));

  const std::unique_ptr<comm::HybridGroups> groups = hybrid.groups(comm);
  Engine engine(examples::engine_comms(comm, groups.get()), opt);

  // Each layer (its weight and bias) is a unit: at stage 3 its parameters exist in full only while
  // the layer's gather scope is open.
  const std::vector<int> ids = examples::register_mlp(engine, model, /*decay_groups=*/true);
  const examples::Mlp::Access access = examples::unit_scope_access(engine, ids);
  engine.finalize();
  if (rank == 0) {
    std::printf("training MLP %d-%d-%d-%d (%zu parameters) on %d rank(s), stage %d%s\n", inputs,
                hidden, hidden, classes, model.num_params(), world, opt.stage,
                opt.deterministic ? ", deterministic" : "");
  }

  examples::RunFlags saves = run_flags;
  saves.use_nodes(engine, comm, pg.env.node, /*one_engine=*/true);
  const int first_step = saves.resume(engine);
  examples::Matrix x;
  std::vector<int> labels;
  for (int step = first_step; step < steps; ++step) {
    double loss_sum = 0.0;
    for (int m = 0; m < micro; ++m) {
      const int64_t first = static_cast<int64_t>(m) * global_batch + static_cast<int64_t>(rank) * local_batch;
      data.batch(step, first, local_batch, &x, &labels);
      loss_sum += model.forward(x, labels, access);
      model.backward(
          engine.loss_scale(), [&](size_t i) { return engine.grad_as<float>(ids[i]); },
          [&](size_t i) { engine.grad_ready(ids[i]); }, access);
      engine.finish_backward();
    }
    const StepResult r = engine.step();
    double loss = loss_sum / micro;
    comm.all_reduce(&loss, 1, DType::kFloat64, comm::ReduceOp::kAvg)->wait();
    if (rank == 0 && ((step + 1) % log_every == 0 || step + 1 == steps)) {
      std::printf("step %3d  loss %.6f  grad_norm %.4f%s\n", step + 1, loss, r.grad_norm,
                  r.skipped ? "  (skipped)" : "");
    }
    // The data is a pure function of the step, so the step (which the checkpoint keeps) is all the
    // loop needs to resume; the blob records it anyway, as a loop with an RNG would.
    saves.after_step(engine, step + 1, steps, "data position: step " + std::to_string(step + 1));
  }
  saves.finish(engine);
  comm.barrier()->wait();
  std::fflush(stdout);
  std::printf("%s", engine.memory_report().table().c_str());
  std::fflush(stdout);
  comm.barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("train_mlp", run, argc, argv); }
