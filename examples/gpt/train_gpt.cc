// Trains the GPT-2-style example on byte-level text with the sharded engine, on as many ranks as the
// launcher starts (the README's main job):
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/gpt/train_gpt [--stage 3]
//
// Each rank trains on its own slice of every global batch. Prints per step the loss, the learning
// rate (warm-up then cosine), tokens/s, the step time with the engine's split (gather and reduce
// waits, the update) and the memory of the largest rank; the validation loss every --val-every
// steps; every rank's memory report; and a sample generated from the model (top-k with --top-k and
// --seed; --top-k 0: greedy). Checkpoints, offload and --config FILE (the engine options, batch, log
// interval and our format's parallel layout from a JSON file, ours or a DeepSpeed config;
// docs/config.md; zero_plan --auto --write-config writes one) and hybrid sharding
// (--shard-group-size N): examples/run_flags.h. Tensor parallelism: --tp T splits the model over
// groups of T consecutive ranks (the engine's data parallelism runs across the groups), with
// --sequence-parallel the residual stream too (docs/parallel.md); --mesh-order (default pp,dp,tp,
// slowest-varying first: tp groups of consecutive ranks) lays the mesh out otherwise. Pipeline
// parallelism: --pp P splits the layers into P stages (--pp-layers for uneven ones) run by --pp-schedule gpipe|1f1b|interleaved|
// zb-h1 (--chunks V for interleaved) over --micro-batches M per data-parallel rank, at any stage;
// the progress line adds the slowest stage's bubble, --timeline FILE writes the last step's actions
// (FILE, JSON) and their drawing beside the simulator's (FILE.svg); docs/pipeline.md. How units
// reduce and gather across the micro-batches (one after another, or the pipeline's):
// --micro-batch-reduce and --micro-batch-gather default|each|once (EngineOptions' policies).
// --recompute: each block keeps only its input and runs its forward again in its backward
// (activation checkpointing; docs/strategy.md). --param-dtype bf16 (stage 3, fp32 parameters): the
// units are gathered and computed in bf16 from fp32 storage (EngineOptions.param_dtype; docs/optim.md).
// --fp32-norms (with --dtype bf16, or --param-dtype bf16): LayerNorm weights and biases stay fp32
// beside the bf16 matrices (parameters of two dtypes; docs/mixed_precision.md).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "comm/mesh.h"
#include "examples/flags.h"
#include "examples/heap.h"
#include "examples/layout_flags.h"
#include "examples/gpt/gpt_flags.h"
#include "examples/process_memory.h"
#include "examples/run_flags.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/gpt_pipeline.h"
#include "examples/gpt/text_data.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/measured.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/timeline_svg.h"
#include "memory/tracker.h"
#include "optim/lr_schedule.h"
#include "zero/engine.h"

namespace {

using namespace zero;
using Clock = std::chrono::steady_clock;

std::string printable(const std::vector<int>& tokens) {
  std::string s;
  for (int t : tokens) s += (t == '\n' || (t >= 32 && t < 127)) ? static_cast<char>(t) : '?';
  return s;
}

// --timeline FILE: the last step's actions of every pipeline rank (JSON) and FILE.svg, the measured
// timeline above the simulator's from the measured mean costs. Written by the first pipeline's
// rank 0 (dp 0, tp 0).
void write_timeline(const std::string& path, const examples::GptPipeline& pipe, const comm::Mesh& mesh,
                    const std::vector<parallel::Span>& spans) {
  const parallel::Schedule& s = pipe.schedule();
  const std::vector<double> mine = parallel::pack_spans(spans);
  std::vector<double> all(mine.size() * static_cast<size_t>(s.ranks));
  mesh.pp().all_gather(mine.data(), all.data(), mine.size(), DType::kFloat64)->wait();
  if (mesh.coord().dp != 0 || mesh.coord().tp != 0 || mesh.coord().pp != 0) return;
  std::vector<std::vector<parallel::Span>> ranks;
  for (int r = 0; r < s.ranks; ++r) ranks.push_back(parallel::unpack_spans(all.data() + r * mine.size(), spans.size()));
  const parallel::MeasuredStep m = parallel::measure(ranks);
  const parallel::SimResult sim = parallel::simulate(s, parallel::measured_costs(s, ranks));
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) ZERO_THROW(IoError, "--timeline: cannot write '{}'", path);
  std::fputs(parallel::spans_json(s, ranks).c_str(), f);
  std::fclose(f);
  const std::string svg = parallel::timeline_svg(
      {{fmt::format("{} measured: step {:.1f} ms, bubble {:.1f}%", s.name, 1e3 * m.step_time, 100 * m.bubble_fraction),
        s.chunks, ranks},
       {fmt::format("{} simulated from the measured costs: step {:.1f} ms, bubble {:.1f}%", s.name, 1e3 * sim.step_time,
                    100 * sim.bubble_fraction),
        s.chunks, sim.timeline}});
  f = std::fopen((path + ".svg").c_str(), "w");
  if (f == nullptr) ZERO_THROW(IoError, "--timeline: cannot write '{}.svg'", path);
  std::fputs(svg.c_str(), f);
  std::fclose(f);
  std::printf("timeline of the last step in %s and %s.svg (measured bubble %.1f%%, simulated %.1f%%)\n", path.c_str(),
              path.c_str(), 100 * m.bubble_fraction, 100 * sim.bubble_fraction);
}

// The example's options without --config (each flag still overrides them).
EngineOptions gpt_defaults() {
  EngineOptions o = examples::gpt_engine_options(3e-3f);
  o.stage = 3;
  return o;
}

int run(int argc, char** argv) {
  examples::keep_freed_memory();
  examples::Flags flags(argc, argv);
  const examples::ConfigFlag config = examples::ConfigFlag::read(flags);
  const int steps = flags.get_int("steps", 400);
  // Sequences per global step (DeepSpeed's train_batch_size).
  const bool batch_given = flags.has("batch");
  const int batch_flag = flags.get_int("batch", 16);
  const examples::GptConfig cfg =
      examples::gpt_config_from_flags(flags, {.block_size = 64, .n_embd = 64, .n_head = 4, .n_layer = 2});
  EngineOptions opt = config.engine_options(flags, gpt_defaults(), "train_gpt");
  const int warmup = flags.get_int("warmup", std::min(20, steps / 10));  // the default fits short runs
  const double min_lr_ratio = flags.get_double("min-lr-ratio", 0.1);
  const int val_every = flags.get_int("val-every", 50);
  const int val_batches = flags.get_int("val-batches", 4);
  const std::string corpus = flags.get("data", examples::default_corpus());
  const int seed = flags.get_int("seed", 1);
  const int sample_tokens = flags.get_int("sample-tokens", 160);
  const int top_k = flags.get_int("top-k", 5);  // 0: greedy
  const int log_every = config.log_every(flags);
  const int loss_digits = flags.get_int("loss-digits", 4);  // tests compare losses to 1e-5 relative
  const bool exact_bytes = flags.get_bool("exact-bytes", false);  // the strategy validation compares bytes
  const examples::RunFlags run_flags = examples::RunFlags::read(flags, opt);
  run_flags.apply(opt);
  // The run's layout: a --config file's (zero_plan --write-config) or the example's, with the engine
  // options' stage, offload and micro-batches, then each layout flag (examples/layout_flags.h).
  // Without a file or a flag that says, a pipeline runs 2 micro-batches per stage.
  Layout base = config.config ? config.config->layout : Layout{.dp = 0};
  base.stage = opt.stage;
  base.offload_optimizer = opt.offload.optimizer;
  base.offload_params = opt.offload.params;
  base.micro_batches = opt.micro_batches;
  Layout layout = examples::layout_from_flags(flags, base);
  const bool m_given = config.config || flags.has("micro-steps") || flags.has("micro-batches") ||
                       layout.micro_batches != base.micro_batches;
  if (layout.pp > 1 && !m_given) layout.micro_batches = 2 * layout.pp;
  const std::vector<int> pp_layers = examples::parse_layer_counts(flags.get("pp-layers", ""));
  const std::string timeline = flags.get("timeline", "");
  // A file's own settings stand unless a flag is given (they are what zero_plan planned with).
  if (flags.has("micro-batch-reduce")) opt.micro_batch_reduce = parse_micro_batch_reduce(flags.get("micro-batch-reduce", ""));
  if (flags.has("micro-batch-gather")) opt.micro_batch_gather = parse_micro_batch_gather(flags.get("micro-batch-gather", ""));
  // The parameters: fp32 or bf16.
  const DType dtype =
      parse_dtype(flags.get("dtype", config.model_dtype() ? dtype_name(*config.model_dtype()) : "fp32"));
  if (flags.has("param-dtype")) opt.param_dtype = parse_dtype(flags.get("param-dtype", ""));
  const bool fp32_norms = flags.get_bool("fp32-norms", false);
  flags.check_all_used();
  if (fp32_norms && dtype != DType::kBFloat16 && !opt.param_dtype) {
    ZERO_THROW(InvalidArgument,
               "--fp32-norms keeps LayerNorms and biases in fp32 beside bf16 matrices: it needs --dtype bf16 or --param-dtype bf16");
  }
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    ZERO_THROW(InvalidArgument, "the GPT runs in fp32 or bf16, got {}{}", dtype_name(dtype),
               flags.has("dtype") ? "" : " (model_dtype of " + config.config->source + ")");
  }
  // A bf16 model keeps a bf16 gradient shard (2Ψ/N), and its reduced gradients are then the same
  // bits at every stage. A config file says for itself.
  if (!config.config) opt.grad_accum_dtype = opt.param_dtype.value_or(dtype);
  if (layout.pp == 1 && (!pp_layers.empty() || !timeline.empty() || flags.has("pp-schedule"))) {
    ZERO_THROW(InvalidArgument, "--pp-schedule, --pp-layers and --timeline need --pp above 1");
  }
  opt = engine_options(layout, opt);
  // The step's micro-batches: one after another (micro-steps) or through the pipeline's schedule.
  const int micro = layout.pp > 1 ? 1 : opt.micro_batches, micro_batches = layout.pp > 1 ? opt.micro_batches : 1;
  const int tp = layout.tp, pp = layout.pp;

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& comm = *pg.host;
  // Groups of tp consecutive ranks hold one stage's part between them, pipeline stages outermost;
  // data parallelism (with its hybrid groups) runs across the copies of each stage.
  layout = with_world(layout, comm.size(), config.config ? "the layout (" + config.config->source + ", then the flags)"
                                                        : "the layout (the flags)");
  comm::Mesh mesh(comm, layout);
  const int rank = comm.rank();
  const int dp_rank = mesh.dp().rank(), world = mesh.dp().size();  // the data-parallel ranks
  config.print(rank);
  if (mesh.hybrid() != nullptr && rank == 0) std::printf("hybrid sharding: %s\n", mesh.hybrid()->layout().c_str());
  const int batch = batch_given ? batch_flag : config.global_batch(opt.micro_batches, world).value_or(batch_flag);
  if (batch % (world * opt.micro_batches) != 0) {
    ZERO_THROW(InvalidArgument, "--batch {} is not a multiple of {} data-parallel ranks x {} micro-batches", batch, world,
               opt.micro_batches);
  }
  const int local = batch / (world * micro * micro_batches);
  const int T = cfg.block_size;
  const examples::TextData data(corpus, T, 0.1, static_cast<uint64_t>(seed));
  const examples::Gpt whole(cfg, static_cast<uint64_t>(seed));
  const examples::GptParallel parallel{tp > 1 ? &mesh.tp() : nullptr, layout.sequence_parallel};
  std::optional<examples::Gpt> model;  // without pipelining: this rank's (tp part of the) model
  if (pp == 1) model.emplace(tp > 1 ? examples::Gpt(whole, parallel) : whole);

  Engine engine(parallel::engine_comms(mesh), opt);
  // The whole model (tp part) in one set of scopes, or this rank's pipeline chunks.
  std::unique_ptr<examples::GptScopes> scopes;
  std::unique_ptr<examples::GptPipeline> pipe;
  if (pp > 1) {
    pipe = std::make_unique<examples::GptPipeline>(
        whole, parallel, mesh, parallel::make_schedule(layout.schedule, pp, micro_batches, layout.chunks, cfg.n_layer),
        pp_layers, engine, dtype, fp32_norms);
  } else {
    scopes = std::make_unique<examples::GptScopes>(engine, *model, dtype, fp32_norms);
  }
  if (model) model->set_recompute(layout.recompute);
  if (pipe) {
    for (examples::Gpt& chunk : pipe->chunks()) chunk.set_recompute(layout.recompute);
  }
  pipe ? pipe->finalize() : engine.finalize();
  const examples::Gpt::Access access = scopes ? scopes->access() : examples::Gpt::Access{};
  // The schedule peaks at group 0's lr; other groups keep their ratio to it.
  std::vector<float> base_lr;
  for (const optim::Hyper& g : opt.optimizer.groups) base_lr.push_back(g.lr);
  const float lr = base_lr[0];
  const optim::LrScheduleOptions schedule{"warmup_cosine", lr, warmup, steps,
                                          static_cast<float>(lr * min_lr_ratio)};
  if (rank == 0) {
    std::printf("GPT %d layers, %d heads, n_embd %d, context %d (%zu %s parameters) on %d rank(s)%s, stage %d%s%s%s\n"
                "data: %s, %zu bytes for training, %zu held out (unigram entropy %.4f nats/byte); global batch %d x "
                "%d tokens\n",
                cfg.n_layer, cfg.n_head, cfg.n_embd, T, whole.num_params(),
                fp32_norms && dtype != DType::kFloat32 ? "bf16 (fp32 norms and biases)" : dtype_name(dtype), comm.size(),
                tp * pp > 1 ? fmt::format(" (dp {} x tp {} x pp {}{}{})", world, tp, pp,
                                          layout.sequence_parallel ? ", sequence parallel" : "",
                                          pipe ? fmt::format(", {} with {} micro-batches", pipe->schedule().name,
                                                             micro_batches) : "").c_str()
                            : "",
                opt.stage,
                opt.offload.optimizer ? ", optimizer offloaded" : "", opt.offload.params ? " (and parameters)" : "",
                layout.recompute ? ", blocks recomputed in backward" : "", data.source().c_str(), data.train_bytes(),
                data.val_bytes(), data.unigram_entropy(), batch, T);
  }

  const int first_step = run_flags.resume(engine, rank == 0);
  std::vector<int> x, y;
  auto validation_loss = [&] {
    // Forward-only: not recorded in stage 3's unit order, so the next step still prefetches.
    EvaluationScope evaluating = engine.evaluation();
    double sum = 0;
    for (int v = 0; v < val_batches; ++v) {
      data.batch(v, dp_rank * (batch / world), batch / world, true, &x, &y);
      sum += pipe ? pipe->evaluate({{x, y, batch / world, T}}) : model->forward(x, y, batch / world, T, access);
    }
    double mean = sum / val_batches;
    comm.all_reduce(&mean, 1, DType::kFloat64, comm::ReduceOp::kAvg)->wait();
    return mean;
  };
  for (int step = first_step; step < steps; ++step) {
    const float step_lr = optim::lr_at(schedule, step);
    for (int g = 0; g < 2; ++g) {
      const float b = base_lr[static_cast<size_t>(g)];
      engine.param_group(g).lr = b == lr ? step_lr : step_lr * (b / lr);
    }
    const auto t0 = Clock::now();
    double loss_sum = 0;
    std::vector<parallel::Span> spans;
    size_t activation_peak = 0;
    for (int m = 0; m < micro; ++m) {
      if (pipe) {
        std::vector<examples::MicroBatch> mbs;
        for (int q = 0; q < micro_batches; ++q) {
          data.batch(step, ((dp_rank * micro + m) * micro_batches + q) * local, local, false, &x, &y);
          mbs.push_back({x, y, local, T});
        }
        examples::GptPipeline::StepResult pr = pipe->train_step(mbs, engine.loss_scale());
        loss_sum += pr.loss;
        spans = std::move(pr.spans);
        activation_peak = std::max(activation_peak, pr.peak_activation_bytes);
      } else {
        data.batch(step, (dp_rank * micro + m) * local, local, false, &x, &y);
        model->reset_peak_activation_bytes();
        loss_sum += model->forward(x, y, local, T, access);
        model->backward(engine.loss_scale(), access);
        activation_peak = std::max(activation_peak, model->peak_activation_bytes());
      }
      engine.finish_backward();
    }
    const StepResult r = engine.step();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    double loss = loss_sum / micro;
    comm.all_reduce(&loss, 1, DType::kFloat64, comm::ReduceOp::kAvg)->wait();
    // The largest rank's memory (the engine's tracker: shards, buffers, the gather window) and, with
    // pipelines, the slowest stage's bubble (idle / its step's compute span), and the largest
    // activation peak: one maximum over the ranks.
    double maxima[3] = {static_cast<double>(engine.device().tracker().current_total()),
                        pipe ? parallel::measure({spans}).worst_bubble : 0.0, static_cast<double>(activation_peak)};
    comm.all_reduce(maxima, 3, DType::kFloat64, comm::ReduceOp::kMax)->wait();
    const double mem = maxima[0];
    const StepTimings& tm = engine.step_timings();
    if (rank == 0 && ((step + 1) % log_every == 0 || step + 1 == steps)) {
      std::printf("step %4d | loss %.*f | norm %.2f | lr %.2e | %7.0f tok/s | %6.1f ms (gather %.1f, reduce %.1f, "
                  "update %.1f) | mem/rank %s%s\n",
                  step + 1, loss_digits, loss, r.grad_norm, step_lr, batch * T / dt, 1e3 * dt, 1e3 * tm.gather_wait_s, 1e3 * tm.reduce_wait_s,
                  1e3 * tm.optimizer_s, memory::format_bytes(static_cast<uint64_t>(mem)).c_str(),
                  fmt::format("{} | activations {}", pipe ? fmt::format(" | bubble {:.1f}%", 100 * maxima[1]) : "",
                              exact_bytes ? fmt::format("{} B", static_cast<uint64_t>(maxima[2]))
                                          : memory::format_bytes(static_cast<uint64_t>(maxima[2]))).c_str());
      std::fflush(stdout);
    }
    if (pipe && !timeline.empty() && step + 1 == steps) write_timeline(timeline, *pipe, mesh, spans);
    if (val_every > 0 && ((step + 1) % val_every == 0 || step + 1 == steps)) {
      const double val = validation_loss();
      if (rank == 0) {
        std::printf("step %4d | validation loss %.4f (unigram entropy %.4f)\n", step + 1, val, data.unigram_entropy());
      }
      // The largest rank's engine memory (tracker) and process memory (RSS), current and peak: the
      // soak run reads these lines to show memory steady after warm-up.
      const memory::MemoryTracker& t = engine.device().tracker();
      const examples::ProcessMemory pm = examples::process_memory();
      double mem4[4] = {static_cast<double>(t.current_total()), static_cast<double>(t.peak_total()),
                        static_cast<double>(pm.rss), static_cast<double>(pm.peak_rss)};
      comm.all_reduce(mem4, 4, DType::kFloat64, comm::ReduceOp::kMax)->wait();
      if (rank == 0) {
        std::printf("memory at step %d | engine %s (peak %s) | rss %s (peak %s) | largest rank\n", step + 1,
                    memory::format_bytes(static_cast<uint64_t>(mem4[0])).c_str(),
                    memory::format_bytes(static_cast<uint64_t>(mem4[1])).c_str(),
                    memory::format_bytes(static_cast<uint64_t>(mem4[2])).c_str(),
                    memory::format_bytes(static_cast<uint64_t>(mem4[3])).c_str());
      }
    }
    run_flags.after_step(engine, step + 1, steps);  // the data is a function of the step, which it keeps
  }
  run_flags.finish(engine, rank == 0);
  comm.barrier()->wait();
  for (int r = 0; r < comm.size(); ++r) {
    if (r == rank) {
      // The engine's table names its data-parallel rank; the mesh coordinate says which part it holds.
      if (tp * pp > 1) {
        std::printf("memory of world rank %d (dp %d, tp %d, pp %d):\n", rank, mesh.coord().dp, mesh.coord().tp,
                    mesh.coord().pp);
      }
      std::printf("%s", engine.memory_report().table().c_str());
      std::fflush(stdout);
    }
    comm.barrier()->wait();
  }
  // A sample: every rank runs the same forwards (at stage 3 they are collective), rank 0 prints.
  if (sample_tokens > 0) {
    EvaluationScope evaluating = engine.evaluation();
    std::vector<int> text = data.prompt("This program is free software", static_cast<size_t>(std::min(16, T)));
    std::mt19937_64 rng(static_cast<uint64_t>(seed));
    for (int i = 0; i < sample_tokens; ++i) {
      std::vector<float> logits = pipe ? pipe->next_logits(text) : model->next_logits(text, access);
      int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (top_k > 0) {
        std::vector<int> order(logits.size());
        for (size_t v = 0; v < order.size(); ++v) order[v] = static_cast<int>(v);
        std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                          [&](int a, int b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
        std::vector<double> w;
        for (int k = 0; k < top_k; ++k) w.push_back(std::exp(logits[static_cast<size_t>(order[static_cast<size_t>(k)])]));
        next = order[std::discrete_distribution<size_t>(w.begin(), w.end())(rng)];
      }
      text.push_back(next);
    }
    if (rank == 0) std::printf("sample (%s):\n%s\n", top_k > 0 ? "top-k" : "greedy", printable(text).c_str());
  }
  comm.barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::examples::run_program("train_gpt", run, argc, argv); }
