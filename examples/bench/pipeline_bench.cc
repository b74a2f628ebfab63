// pipeline_bench: the GPT trained through a pipeline of P stages (one per rank), every schedule at
// m = 4, 8, 16 micro-batches, measured beside the simulator (parallel/pipeline/schedule_sim.h):
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/bench/pipeline_bench
//       [--schedules gpipe,1f1b,interleaved,zb-h1,zb-v] [--m 4,8,16] [--steps 6] [--warmup 2]
//       [--n-layer 4 --n-embd 128 --n-head 4 --block-size 64 --micro-batch 2] [--stage 1] [--svg FILE --svg-m 8]
//
// Per row (rank 0 prints): the pipeline's measured step (the spans of every rank on one clock: the
// steady clock is shared by the processes of a machine), the simulator's step from the measured
// mean F/B/W cost of each virtual stage and the measured one-way transfer time of an activation,
// their ratio, the bubble (idle / (ranks x step)) measured and simulated, each stage's measured
// bubble, each stage's peak activation bytes (the model's own count, Gpt::activation_bytes) and how
// many micro-batches' worth that is, whether the replay of the schedule from the model's sizes
// (parallel/pipeline/held_activations.h, what the planner prices) gives those peaks to the byte,
// the largest peak over 1F1B's (the first stage's p micro-batches of the p-stage cut), and
// tokens/s over the whole step (optimizer included). Medians over --steps after --warmup (the
// bubbles and the timeline are the median step's). ZB-H1 is generated from the F, B and W times of a
// probe run of its unit-time form (2 steps after --warmup) and the model's activation sizes. --svg
// draws, for every schedule at --svg-m, the measured timeline above the simulated one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "comm/mesh.h"
#include "tools/cli/flags.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_flags.h"
#include "examples/gpt/gpt_pipeline.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/measured.h"
#include "parallel/pipeline/schedule_sim.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/timeline_svg.h"
#include "zero/engine.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One-way time of an activation-sized transfer between pipeline ranks 0 and 1 (ping-pong / 2).
double transfer_seconds(comm::Communicator& pp, size_t numel) {
  if (pp.size() < 2) return 0.0;
  std::vector<float> buf(numel, 1.0f);
  std::vector<double> times;
  for (int i = 0; i < 21; ++i) {
    pp.barrier()->wait();
    const auto t0 = Clock::now();
    if (pp.rank() == 0) {
      pp.send(buf.data(), numel, DType::kFloat32, 1)->wait();
      pp.recv(buf.data(), numel, DType::kFloat32, 1)->wait();
    } else if (pp.rank() == 1) {
      pp.recv(buf.data(), numel, DType::kFloat32, 0)->wait();
      pp.send(buf.data(), numel, DType::kFloat32, 0)->wait();
    }
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 2);
  }
  double t = median(times);
  pp.broadcast(&t, 1, DType::kFloat64, 0)->wait();
  return t;
}

// One step of `pipe` (micro-batches of B x T tokens, varied by `salt`): every rank's spans on one
// clock (the steady clock is shared by the processes of a machine), the slowest rank's wall time,
// and this rank's activation peak.
struct StepRun {
  std::vector<std::vector<parallel::Span>> aligned;
  double wall = 0;
  size_t peak = 0;
};
StepRun run_step(examples::GptPipeline& pipe, Engine& engine, comm::Communicator& world, const comm::Mesh& mesh,
                 const examples::GptConfig& cfg, int m, int B, int T, int salt) {
  const int p = mesh.pp().size();
  std::vector<examples::MicroBatch> mbs;
  for (int q = 0; q < m; ++q) {
    examples::MicroBatch mb{std::vector<int>(static_cast<size_t>(B * T)), std::vector<int>(static_cast<size_t>(B * T)), B, T};
    for (size_t e = 0; e < mb.inputs.size(); ++e) {
      mb.inputs[e] = static_cast<int>((e * 7 + static_cast<size_t>(q + salt)) % static_cast<size_t>(cfg.vocab_size));
      mb.targets[e] = static_cast<int>((e * 5 + 3) % static_cast<size_t>(cfg.vocab_size));
    }
    mbs.push_back(std::move(mb));
  }
  world.barrier()->wait();
  const auto t0 = Clock::now();
  const examples::GptPipeline::StepResult r = pipe.train_step(mbs, engine.loss_scale());
  engine.step();
  StepRun out;
  out.wall = std::chrono::duration<double>(Clock::now() - t0).count();
  out.peak = r.peak_activation_bytes;
  // Every rank's spans and start, on every rank.
  std::vector<double> mine = parallel::pack_spans(r.spans);
  mine.push_back(r.start_s);
  std::vector<double> every(mine.size() * static_cast<size_t>(p));
  mesh.pp().all_gather(mine.data(), every.data(), mine.size(), DType::kFloat64)->wait();
  double first = every[mine.size() - 1];
  for (int k = 0; k < p; ++k) first = std::min(first, every[(k + 1) * mine.size() - 1]);
  for (int k = 0; k < p; ++k) {
    std::vector<parallel::Span> spans = parallel::unpack_spans(every.data() + k * mine.size(), r.spans.size());
    const double shift = every[(k + 1) * mine.size() - 1] - first;
    for (parallel::Span& x : spans) {
      x.start += shift;
      x.end += shift;
    }
    out.aligned.push_back(std::move(spans));
  }
  world.all_reduce(&out.wall, 1, DType::kFloat64, comm::ReduceOp::kMax)->wait();
  return out;
}

struct Row {
  std::string schedule;
  int m = 0;
  double measured = 0, simulated = 0, bubble = 0, sim_bubble = 0, tokens_per_s = 0;
  std::vector<double> stage_bubble, peak_bytes, held;
  bool replay_exact = false;
  double over_1f1b = 0;  // the largest stage peak / 1F1B's peak
  parallel::TimelinePanel measured_panel, simulated_panel;
};

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const std::vector<std::string> schedules = flags.get_list("schedules", "gpipe,1f1b,interleaved,zb-h1,zb-v");
  std::vector<int> ms;
  for (const std::string& m : flags.get_list("m", "4,8,16")) ms.push_back(std::stoi(m));
  const int steps = flags.get_int("steps", 6);
  const int warmup = flags.get_int("warmup", 2);
  const examples::GptConfig cfg =
      examples::gpt_config_from_flags(flags, {.block_size = 64, .n_embd = 128, .n_head = 4, .n_layer = 4});
  const int B = flags.get_int("micro-batch", 2);
  const int stage = flags.get_int("stage", 1);
  const std::string svg = flags.get("svg", "");
  const int svg_m = flags.get_int("svg-m", 8);
  flags.check_all_used();
  if (steps < 1 || warmup < 0 || B < 1) ZERO_THROW(InvalidArgument, "--steps, --warmup and --micro-batch must be positive");

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& world = *pg.host;
  const int p = world.size();
  comm::Mesh mesh(world, comm::MeshShape{.pp = p, .dp = 1, .tp = 1});
  const examples::Gpt whole(cfg, 1);
  const int T = cfg.block_size;
  const double transfer = transfer_seconds(mesh.pp(), static_cast<size_t>(B) * T * cfg.n_embd);
  if (world.rank() == 0) {
    std::printf("pipeline_bench: GPT %d layers, n_embd %d, %d heads, T %d, micro-batch %d x %d tokens, %d stages (one per "
                "rank), ZeRO stage %d; one-way activation transfer %.3f ms; medians of %d steps after %d\n",
                cfg.n_layer, cfg.n_embd, cfg.n_head, T, B, T, p, stage, 1e3 * transfer, steps, warmup);
    std::printf("%-12s %3s | %9s %9s %6s | %7s %7s | %-17s | %-23s | %-13s | %6s %6s | %8s\n", "schedule", "m",
                "step ms", "sim ms", "sim/ms", "bubble", "sim", "bubble per stage", "peak activations/stage",
                "micro-batches", "replay", "/1F1B", "tok/s");
  }
  std::vector<Row> rows;
  for (const std::string& name : schedules) {
    for (int m : ms) {
      const int chunks = name == "interleaved" || name == "zb-v" ? 2 : 1;
      if (name == "zb-v" && cfg.n_layer < 2 * p) continue;  // a V of 2p chunks needs as many layers
      if (name == "interleaved" && (m % p != 0 || cfg.n_layer % (p * chunks) != 0)) continue;
      EngineOptions opt = strategy::gpt2_engine_options(1e-3f);
      opt.stage = stage;
      opt.micro_batches = m;
      // ZB-H1 fits its order to the F, B and W times, as the paper's scheduler takes profiled ones:
      // a probe run of the unit-time schedule measures them (every rank gets the same figures, so
      // every rank generates the same schedule).
      parallel::ActionCosts times;
      if (name == "zb-h1") {
        Engine probe_engine(parallel::engine_comms(mesh), opt);
        examples::GptPipeline probe(whole, {}, mesh, examples::gpt_schedule(name, cfg, p, m, chunks, {}, 1, false, B, T, false),
                                    {}, probe_engine);
        probe.finalize();
        std::vector<std::vector<parallel::Span>> spans(static_cast<size_t>(p));
        for (int i = 0; i < warmup + 2; ++i) {
          const StepRun run = run_step(probe, probe_engine, world, mesh, cfg, m, B, T, i);
          if (i < warmup) continue;
          for (int k = 0; k < p; ++k) {
            spans[static_cast<size_t>(k)].insert(spans[static_cast<size_t>(k)].end(), run.aligned[static_cast<size_t>(k)].begin(),
                                                 run.aligned[static_cast<size_t>(k)].end());
          }
        }
        times = parallel::measured_costs(probe.schedule(), spans);
        times.transfer = transfer;
      }
      Engine engine(parallel::engine_comms(mesh), opt);
      examples::GptPipeline pipe(whole, {}, mesh, examples::gpt_schedule(name, cfg, p, m, chunks, {}, 1, false, B, T, false, times),
                                 {}, engine);
      pipe.finalize();
      size_t per_mb = 0;
      {
        EvaluationScope evaluating = engine.evaluation();
        per_mb = pipe.activation_bytes_per_micro_batch(B, T);
      }
      const parallel::Schedule& s = pipe.schedule();
      std::vector<double> step_times, pipeline_times;
      std::vector<std::vector<parallel::Span>> all_spans(static_cast<size_t>(p));  // every measured step, for the costs
      std::vector<std::vector<std::vector<parallel::Span>>> measured_steps;  // aligned, per step
      size_t peak = 0;
      for (int i = 0; i < warmup + steps; ++i) {
        StepRun run = run_step(pipe, engine, world, mesh, cfg, m, B, T, i);
        if (i < warmup) continue;
        step_times.push_back(run.wall);
        pipeline_times.push_back(parallel::measure(run.aligned).step_time);
        for (int k = 0; k < p; ++k) {
          all_spans[static_cast<size_t>(k)].insert(all_spans[static_cast<size_t>(k)].end(), run.aligned[static_cast<size_t>(k)].begin(),
                                                   run.aligned[static_cast<size_t>(k)].end());
        }
        peak = std::max(peak, run.peak);
        measured_steps.push_back(std::move(run.aligned));
      }
      // The step of median pipeline time: its timeline and bubbles stand for the row.
      std::vector<size_t> order(pipeline_times.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return pipeline_times[a] < pipeline_times[b]; });
      const std::vector<std::vector<parallel::Span>>& last = measured_steps[order[order.size() / 2]];
      // The median step's figures; the costs from every measured step.
      Row row;
      row.schedule = s.name;
      row.m = m;
      row.measured = median(pipeline_times);
      parallel::ActionCosts costs = parallel::measured_costs(s, all_spans);
      costs.transfer = transfer;
      costs.held = examples::gpt_held_bytes(cfg, s.virtual_stages(), {}, 1, false, B, T, false);
      const parallel::SimResult sim = parallel::simulate(s, costs);
      row.simulated = sim.step_time;
      const parallel::MeasuredStep last_measure = parallel::measure(last);
      row.bubble = last_measure.bubble_fraction;
      for (int k = 0; k < p; ++k) row.stage_bubble.push_back(last_measure.idle[static_cast<size_t>(k)] / last_measure.step_time);
      row.sim_bubble = sim.bubble_fraction;
      row.tokens_per_s = static_cast<double>(m) * B * T / median(step_times);
      std::vector<double> peaks(static_cast<size_t>(p)), per(static_cast<size_t>(p));
      double mine_peak = static_cast<double>(peak), mine_per = static_cast<double>(per_mb);
      mesh.pp().all_gather(&mine_peak, peaks.data(), 1, DType::kFloat64)->wait();
      mesh.pp().all_gather(&mine_per, per.data(), 1, DType::kFloat64)->wait();
      row.peak_bytes = peaks;
      row.replay_exact = peaks == sim.peak_held;
      const double one_f_one_b =
          parallel::one_f_one_b_peak(examples::gpt_held_bytes(cfg, p, {}, 1, false, B, T, false), p, 1, m);
      row.over_1f1b = *std::max_element(peaks.begin(), peaks.end()) / one_f_one_b;
      for (int k = 0; k < p; ++k) row.held.push_back(per[static_cast<size_t>(k)] > 0 ? peaks[static_cast<size_t>(k)] / per[static_cast<size_t>(k)] : 0);
      row.measured_panel = {fmt::format("{} m = {} measured: step {:.1f} ms, bubble {:.1f}%", s.name, m, 1e3 * last_measure.step_time,
                                        100 * row.bubble),
                            s.chunks, last};
      row.simulated_panel = {fmt::format("{} m = {} simulated from the measured costs: step {:.1f} ms, bubble {:.1f}%", s.name,
                                         m, 1e3 * sim.step_time, 100 * sim.bubble_fraction),
                             s.chunks, sim.timeline};
      if (world.rank() == 0) {
        std::string per_stage, act, held;
        for (int k = 0; k < p; ++k) {
          per_stage += fmt::format("{}{:.1f}%", k ? " " : "", 100 * row.stage_bubble[static_cast<size_t>(k)]);
          act += fmt::format("{}{:.0f}K", k ? " " : "", row.peak_bytes[static_cast<size_t>(k)] / 1024);
          held += fmt::format("{}{:.1f}", k ? " " : "", row.held[static_cast<size_t>(k)]);
        }
        std::printf("%-12s %3d | %9.2f %9.2f %6.3f | %6.1f%% %6.1f%% | %-17s | %-23s | %-13s | %6s %6.3f | %8.0f\n",
                    row.schedule.c_str(), m, 1e3 * row.measured, 1e3 * row.simulated, row.simulated / row.measured,
                    100 * row.bubble, 100 * row.sim_bubble, per_stage.c_str(), act.c_str(), held.c_str(),
                    row.replay_exact ? "exact" : "DIFFERS", row.over_1f1b, row.tokens_per_s);
        std::fflush(stdout);
      }
      rows.push_back(std::move(row));
    }
  }
  if (!svg.empty() && world.rank() == 0) {
    std::vector<parallel::TimelinePanel> panels;
    for (const Row& r : rows) {
      if (r.m != svg_m) continue;
      panels.push_back(r.measured_panel);
      panels.push_back(r.simulated_panel);
    }
    std::ofstream(svg) << parallel::timeline_svg(panels);
    std::printf("timelines at m = %d in %s\n", svg_m, svg.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::cli::run_program("pipeline_bench", zero::run, argc, argv); }
