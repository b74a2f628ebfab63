// Trains the GPT-2-style example on byte-level text with the sharded engine, on as many ranks as the
// launcher starts (the README's main job):
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/gpt/train_gpt [--stage 3]
//
// Each data-parallel rank trains on its own slice of every global batch. Prints per step the loss,
// the learning rate (warm-up then cosine), tokens/s, the step time with the engine's split (gather
// and reduce waits, the update) and the memory of the largest rank; the validation loss every
// --val-every steps; every rank's memory report; and a sample generated from the model. The run's
// layout (--layout dp=2,tp=2,pp=2,stage=3 or one flag per field: --tp, --pp, --pp-schedule, ...)
// builds the device mesh; with pp 1 this rank holds the (tensor-parallel part of the) whole model,
// above it its pipeline stage's chunks. Every flag, --config FILE and what the lines mean:
// docs/gpt.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/fault_injection.h"
#include "comm/launch/process_group.h"
#include "comm/mesh.h"
#include "comm/peer_traffic.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/gpt_pipeline.h"
#include "examples/gpt/gpt_run.h"
#include "examples/gpt/gpt_sample.h"
#include "examples/gpt/progress_log.h"
#include "examples/gpt/text_data.h"
#include "examples/heap.h"
#include "examples/mesh_memory.h"
#include "memory/tracker.h"
#include "optim/lr_schedule.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/measured.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/step_timeline.h"
#include "tools/cli/flags.h"
#include "zero/engine.h"

namespace {

using namespace zero;
using Clock = std::chrono::steady_clock;

int run(int argc, char** argv) {
  examples::keep_freed_memory();
  cli::Flags flags(argc, argv);
  examples::GptRun run = examples::GptRun::read(flags);
  const examples::GptConfig& cfg = run.model;
  comm::ProcessGroup pg = comm::init_process_group();
  if (const fault::Plan* plan = run.fault_for(pg.host->rank(), pg.env.restart_count)) fault::arm(*plan);
  // tp groups of consecutive ranks hold one stage's part between them, pipeline stages outermost;
  // data parallelism (with its hybrid groups) runs across the copies of each stage. After a restart
  // on fewer ranks than launched, the launch's layout shrunk to them; the ranks past it are spares.
  const Layout layout = run.at_world(pg.host->size(), pg.env.first_world_size);
  std::unique_ptr<comm::Communicator> active;
  if (run.spares > 0) {
    active = pg.host->split(pg.host->rank() < layout.world() ? 0 : -1, pg.host->rank());
    if (!active) {
      std::printf("rank %d: a spare (the layout %s takes %d of the %d ranks left); it waits as a replacement\n",
                  pg.host->rank(), describe(layout).c_str(), layout.world(), pg.host->size());
      return 0;
    }
  }
  comm::Communicator& comm = active ? *active : *pg.host;
  comm::Mesh mesh(comm, layout);
  const int rank = comm.rank(), dp_rank = mesh.dp().rank(), world = mesh.dp().size(), T = cfg.block_size;
  run.config.print(rank);
  if (mesh.hybrid() != nullptr && rank == 0) std::printf("hybrid sharding: %s\n", mesh.hybrid()->layout().c_str());
  const int batch = run.global_batch(world), m = layout.micro_batches, local = batch / (world * m);
  const examples::TextData data(run.corpus, T, 0.1, static_cast<uint64_t>(run.seed));
  const examples::Gpt whole(cfg, static_cast<uint64_t>(run.seed));
  const examples::GptParallel parallel{layout.tp > 1 ? &mesh.tp() : nullptr, layout.sequence_parallel};

  // hpZ and qgZ work on nodes: without --hpz-size, the data-parallel peers on this rank's node (the
  // launcher's LOCAL_WORLD_SIZE ranks hold tp-sized groups of them).
  // Only where they are on: after an elastic restart the nodes may hold different numbers of ranks.
  const bool node_parts = run.options.secondary_shard || run.options.quantized_gradients.bits != 0;
  if (node_parts && run.options.node_size == 0) {
    run.options.node_size = std::clamp(pg.env.local_world_size / layout.tp, 1, world);
  }
  // Without a pipeline: this rank's (tp part of the) model in one set of the engine's unit scopes;
  // with one, this rank's chunks in a pipeline stage whose schedule runs the step's m micro-batches.
  Engine engine(parallel::engine_comms(mesh), run.options);
  std::optional<examples::Gpt> model;
  std::unique_ptr<examples::GptScopes> scopes;
  std::unique_ptr<examples::GptPipeline> pipe;
  if (layout.pp > 1) {
    pipe = std::make_unique<examples::GptPipeline>(
        whole, parallel, mesh,
        examples::gpt_schedule(layout.schedule, cfg, layout.pp, m, layout.chunks, run.pp_layers, layout.tp,
                               layout.sequence_parallel, local, T, layout.recompute),
        run.pp_layers, engine, run.dtype, run.fp32_norms);
    for (examples::Gpt& chunk : pipe->chunks()) chunk.set_recompute(layout.recompute);
    pipe->finalize();
  } else {
    model.emplace(layout.tp > 1 ? examples::Gpt(whole, parallel) : whole);
    model->set_recompute(layout.recompute);
    scopes = std::make_unique<examples::GptScopes>(engine, *model, run.dtype, run.fp32_norms);
    engine.finalize();
  }
  const examples::Gpt::Access access = scopes ? scopes->access() : examples::Gpt::Access{};
  // The schedule peaks at group 0's lr; other groups keep their ratio to it.
  const std::vector<optim::Hyper>& groups = run.options.optimizer.groups;
  const float lr = groups[0].lr;
  const optim::LrScheduleOptions schedule{"warmup_cosine", lr, run.warmup, run.steps,
                                          static_cast<float>(lr * run.min_lr_ratio)};
  if (rank == 0) {
    std::printf("GPT %d layers, %d heads, n_embd %d, context %d (%zu %s parameters) on %d rank(s)%s, stage %d%s%s%s\n"
                "data: %s, %zu bytes for training, %zu held out (unigram entropy %.4f nats/byte); global batch %d x "
                "%d tokens\n",
                cfg.n_layer, cfg.n_head, cfg.n_embd, T, whole.num_params(),
                run.fp32_norms && run.dtype != DType::kFloat32 ? "bf16 (fp32 norms and biases)" : dtype_name(run.dtype),
                comm.size(),
                layout.tp * layout.pp > 1
                    ? fmt::format(" (dp {} x tp {} x pp {}{}{})", world, layout.tp, layout.pp,
                                  layout.sequence_parallel ? ", sequence parallel" : "",
                                  pipe ? fmt::format(", {} with {} micro-batches", pipe->schedule().name, m) : "")
                          .c_str()
                    : "",
                layout.stage, layout.offload_optimizer ? ", optimizer offloaded" : "",
                layout.offload_params ? " (and parameters)" : "", layout.recompute ? ", blocks recomputed in backward" : "",
                data.source().c_str(), data.train_bytes(), data.val_bytes(), data.unigram_entropy(), batch, T);
  }

  if (pg.env.restart_count > 0 && rank == 0) {
    std::printf("restart %d after %s: %s on %d of the %d ranks launched\n", pg.env.restart_count,
                pg.env.restart_reason.c_str(), describe(layout).c_str(), layout.world(), pg.env.first_world_size);
  }
  run.run_flags.use_nodes(engine, comm, pg.env.node, layout.tp * layout.pp == 1);
  const int first_step = run.run_flags.resume(engine, rank == 0);
  std::optional<examples::ProgressLog> progress;
  if (rank == 0) progress.emplace(run.metrics);
  std::vector<int> x, y;
  for (int step = first_step; step < run.steps; ++step) {
    const float step_lr = optim::lr_at(schedule, step);
    for (size_t g = 0; g < groups.size(); ++g) {
      engine.param_group(static_cast<int>(g)).lr = groups[g].lr == lr ? step_lr : step_lr * (groups[g].lr / lr);
    }
    const auto t0 = Clock::now();
    const std::vector<uint64_t> sent_before = pg.traffic->sent();
    // The step's m micro-batches of `local` sequences, this data-parallel rank's slice of the batch:
    // through the pipeline's schedule, or one after another, each closed by finish_backward().
    double loss = 0;
    size_t activation_peak = 0;
    examples::GptPipeline::StepResult piped;
    if (pipe) {
      std::vector<examples::MicroBatch> mbs;
      for (int q = 0; q < m; ++q) {
        data.batch(step, (dp_rank * m + q) * local, local, false, &x, &y);
        mbs.push_back({x, y, local, T});
      }
      piped = pipe->train_step(mbs, engine.loss_scale());
      loss = piped.loss;
      activation_peak = piped.peak_activation_bytes;
      engine.finish_backward();
    } else {
      for (int q = 0; q < m; ++q) {
        data.batch(step, (dp_rank * m + q) * local, local, false, &x, &y);
        model->reset_peak_activation_bytes();
        loss += model->forward(x, y, local, T, access);
        model->backward(engine.loss_scale(), access);
        activation_peak = std::max(activation_peak, model->peak_activation_bytes());
        engine.finish_backward();
      }
      loss /= m;
    }
    const StepResult r = engine.step();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    comm.all_reduce(&loss, 1, DType::kFloat64, comm::ReduceOp::kAvg)->wait();
    // The largest rank's engine memory, the slowest stage's bubble and the largest activation peak.
    double maxima[3] = {static_cast<double>(engine.device().tracker().current_total()),
                        pipe ? parallel::measure({piped.spans}).worst_bubble : 0.0, static_cast<double>(activation_peak)};
    comm.all_reduce(maxima, 3, DType::kFloat64, comm::ReduceOp::kMax)->wait();
    // What every rank sent this step, by link (nodes: the launcher's LOCAL_WORLD_SIZE consecutive
    // ranks); this sum's own bytes count in the next step.
    std::vector<uint64_t> sent = pg.traffic->sent();
    for (size_t p = 0; p < sent.size(); ++p) sent[p] -= sent_before[p];
    const comm::LinkBytes link = comm::by_link(sent, rank, pg.env.local_world_size);
    double links[2] = {static_cast<double>(link.in_node), static_cast<double>(link.between_nodes)};
    comm.all_reduce(links, 2, DType::kFloat64, comm::ReduceOp::kSum)->wait();
    const StepTimings& tm = engine.step_timings();
    if (progress && ((step + 1) % run.log_every == 0 || step + 1 == run.steps)) {
      progress->step({.step = step + 1, .loss = loss, .grad_norm = r.grad_norm, .lr = step_lr,
                      .tokens_per_s = batch * T / dt, .step_s = dt, .gather_s = tm.gather_wait_s,
                      .reduce_s = tm.reduce_wait_s, .update_s = tm.optimizer_s,
                      .memory_bytes = static_cast<uint64_t>(maxima[0]), .activation_bytes = static_cast<uint64_t>(maxima[2]),
                      .bubble = pipe ? std::optional(maxima[1]) : std::nullopt,
                      .in_node_bytes = static_cast<uint64_t>(links[0]), .between_nodes_bytes = static_cast<uint64_t>(links[1])});
    }
    if (pipe && !run.timeline.empty() && step + 1 == run.steps) {
      const parallel::StepTimeline t =
          parallel::write_step_timeline(run.timeline, pipe->schedule(), mesh.pp(), piped.spans, rank == 0);
      if (rank == 0) {
        std::printf("timeline of the last step in %s and %s.svg (measured bubble %.1f%%, simulated %.1f%%)\n",
                    run.timeline.c_str(), run.timeline.c_str(), 100 * t.measured_bubble, 100 * t.simulated_bubble);
      }
    }
    if (run.val_every > 0 && ((step + 1) % run.val_every == 0 || step + 1 == run.steps)) {
      // Forward only: not recorded in stage 3's unit order, so the next step still prefetches.
      EvaluationScope evaluating = engine.evaluation();
      const int rows = batch / world;
      double val = 0;
      for (int v = 0; v < run.val_batches; ++v) {
        data.batch(v, dp_rank * rows, rows, true, &x, &y);
        val += pipe ? pipe->evaluate({{x, y, rows, T}}) : model->forward(x, y, rows, T, access);
      }
      val /= run.val_batches;
      comm.all_reduce(&val, 1, DType::kFloat64, comm::ReduceOp::kAvg)->wait();
      if (progress) progress->validation(step + 1, val, data.unigram_entropy());
      examples::report_memory(engine, mesh, step + 1);
    }
    if (pg.env.restart_count > 0 && step == first_step && rank == 0) {
      const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::printf("restart %d: step %d trained %.1f s after the failure\n", pg.env.restart_count, step + 1,
                  now - pg.env.restart_failed_at);
    }
    run.run_flags.after_step(engine, step + 1, run.steps);  // the data is a function of the step, which it keeps
  }
  run.run_flags.finish(engine, rank == 0);
  examples::print_memory_tables(engine, mesh);
  // A sample: every rank runs the same forwards (at stage 3 they are collective), rank 0 prints.
  if (run.sample_tokens > 0) {
    EvaluationScope evaluating = engine.evaluation();
    const std::vector<int> text = examples::sample_text(
        data.prompt("This program is free software", static_cast<size_t>(std::min(16, T))), run.sample_tokens, run.top_k,
        static_cast<uint64_t>(run.seed),
        [&](const std::vector<int>& t) { return pipe ? pipe->next_logits(t) : model->next_logits(t, access); });
    if (rank == 0) std::printf("sample (%s):\n%s\n", run.top_k > 0 ? "top-k" : "greedy", examples::printable(text).c_str());
  }
  comm.barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("train_gpt", run, argc, argv); }
