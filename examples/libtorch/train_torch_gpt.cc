// The LibTorch GPT (examples/libtorch/torch_gpt.h: tensor-parallel torch::nn layers, its head tied
// to the token embedding) trained through TorchPipeline at any (dp, tp, pp) and ZeRO stage, on as
// many ranks as the launcher starts:
//
//   bazel build --config=libtorch //examples/libtorch:train_torch_gpt //comm/launch:zerorun
//   bazel-bin/comm/launch/zerorun --nproc-per-node 8 -- bazel-bin/examples/libtorch/train_torch_gpt
//       --tp 2 --pp 2 --stage 1 --steps 200 --save ckpt        (one command line)
//
// Flags: the layout's (examples/layout_flags.h: --dp (0: what the world leaves), --tp, --pp, --stage,
// --micro-batches, --pp-schedule, --chunks, --recompute, --layout), the checkpoint's
// (examples/run_flags.h: --save, --save-every, --resume, --export), the model's (--vocab,
// --block-size, --layers, --heads, --embd), --batch (the global batch), --steps, --lr,
// --weight-decay, --max-grad-norm, --deterministic, --seed, --log-every. A checkpoint resumes at any
// other layout and stage, at the step it was saved after.
//
// The data: step s's global batch is drawn from --seed and s alone (random tokens, each target the
// token's image under a fixed map of the vocabulary, which the model learns), so every layout, and a
// run resumed at step s, sees the same batches. Rank 0 prints the loss, the step time and progress,
// the largest rank's memory every --log-every steps, and every rank's memory report at the end.
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "adapters/libtorch/torch_pipeline.h"
#include "base/error.h"
#include "comm/launch/process_group.h"
#include "comm/mesh.h"
#include "examples/layout_flags.h"
#include "examples/libtorch/torch_gpt.h"
#include "examples/mesh_memory.h"
#include "examples/run_flags.h"
#include "layout/layout.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/pipeline_stage.h"
#include "parallel/pipeline/schedules.h"
#include "tools/cli/flags.h"
#include "zero/engine.h"
#include "zero/engine_options.h"

namespace {

using Clock = std::chrono::steady_clock;

// Step `step`'s global batch: tokens [batch, T] and their targets.
std::pair<torch::Tensor, torch::Tensor> batch_of(const zero::examples::TorchGptConfig& c, int batch, uint64_t seed,
                                                 int step) {
  at::Generator gen = at::detail::createCPUGenerator(seed * 1000003ULL + static_cast<uint64_t>(step));
  const torch::Tensor tokens = at::randint(c.vocab, {batch, c.block_size}, gen, torch::kLong);
  return {tokens, (tokens * 5 + 1) % c.vocab};
}

int run(int argc, char** argv) {
  using namespace zero;
  cli::Flags flags(argc, argv);
  examples::TorchGptConfig cfg;
  cfg.vocab = flags.get_int("vocab", 64);
  cfg.block_size = flags.get_int("block-size", 16);
  cfg.n_layer = flags.get_int("layers", 4);
  cfg.n_head = flags.get_int("heads", 4);
  cfg.n_embd = flags.get_int("embd", 64);
  const int batch = flags.get_int("batch", 16);
  const int steps = flags.get_int("steps", 50);
  const int log_every = flags.get_int("log-every", 10);
  const uint64_t seed = static_cast<uint64_t>(flags.get_int("seed", 1));
  EngineOptions base;
  base.optimizer.kind = optim::OptimizerKind::kAdamW;
  base.optimizer.groups = {optim::Hyper{.lr = static_cast<float>(flags.get_double("lr", 1e-3)),
                                        .weight_decay = static_cast<float>(flags.get_double("weight-decay", 0.01))}};
  base.max_grad_norm = static_cast<float>(flags.get_double("max-grad-norm", 1.0));
  base.deterministic = flags.get_bool("deterministic", false);  // rank-ordered sums (engine_options.h)
  Layout defaults;
  defaults.dp = 0;  // what the world leaves
  defaults.micro_batches = 4;
  const Layout given = examples::layout_from_flags(flags, defaults);
  const examples::RunFlags run_flags = examples::RunFlags::read(flags);
  flags.check_all_used();
  torch::set_num_threads(1);

  comm::ProcessGroup pg = comm::init_process_group();
  const Layout layout = with_world(given, pg.host->size(), "train_torch_gpt");
  comm::Mesh mesh(*pg.host, layout);
  const comm::MeshShape shape = mesh.shape();
  if (batch % shape.dp != 0) {
    ZERO_THROW(InvalidArgument, "--batch {} is not a multiple of the {} data-parallel ranks", batch, shape.dp);
  }
  Engine engine(parallel::engine_comms(mesh), engine_options(layout, base));
  parallel::PipelineStage pipe(mesh, engine,
                               parallel::make_schedule(layout.schedule, shape.pp, layout.micro_batches, layout.chunks),
                               {.layers = cfg.layers()});
  const int first = pipe.data_parallel_slice(batch).first;
  torch::Tensor tokens, targets;  // this step's global batch
  auto mine = [&](const torch::Tensor& t, const parallel::StageCall& c) {
    return t.slice(0, first + c.sample_begin, first + c.sample_end);
  };
  libtorch::TorchPipeline stages(
      engine, pipe, [&](int l) { return examples::gpt_layer(cfg, mesh.tp(), l, seed); },
      {.input = [&](const parallel::StageCall& c) { return mine(tokens, c); },
       .loss = [&](const parallel::StageCall& c,
                   const torch::Tensor& out) { return examples::gpt_loss(cfg, mesh.tp(), out, mine(targets, c)); },
       .activation_shape = [&](int, int n) { return std::vector<int64_t>{n, cfg.block_size, cfg.n_embd}; },
       .recompute = layout.recompute,
       .tied = examples::gpt_tied(cfg)});
  stages.finalize();
  const bool says = mesh.world().rank() == 0;
  const int start = run_flags.resume(engine, says);
  if (says) {
    std::printf("LibTorch GPT: %lld layers of width %lld, vocabulary %lld, context %lld | %s | batch %d, %d steps\n",
                static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_embd), static_cast<long long>(cfg.vocab),
                static_cast<long long>(cfg.block_size), describe(layout).c_str(), batch, steps);
  }
  const auto t0 = Clock::now();
  for (int step = start; step < steps; ++step) {
    std::tie(tokens, targets) = batch_of(cfg, batch, seed, step);
    const auto t = Clock::now();
    const parallel::PipelineStage::StepResult r = pipe.train_step(batch / shape.dp, engine.loss_scale());
    const StepResult s = engine.step();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    if (says) {
      std::printf("step %4d/%d  loss %.6f  grad_norm %.4f  %.1f ms\n", step + 1, steps, r.loss, s.grad_norm, ms);
    }
    run_flags.after_step(engine, step + 1, steps);
    if (log_every > 0 && ((step + 1) % log_every == 0 || step + 1 == steps)) {
      examples::report_memory(engine, mesh, step + 1);
    }
  }
  run_flags.finish(engine, says);
  if (says) {
    std::printf("%d steps in %.1f s\n", steps - start, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  examples::print_memory_tables(engine, mesh);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("train_torch_gpt", run, argc, argv); }
