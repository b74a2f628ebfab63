// zero_bench: the GPT example at each configuration on the ranks zerorun starts, measured and
// planned in the same run:
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/bench/zero_bench
//       [--configs 0,1,2,3,0+offload,1+offload,2+offload,3+offload] [--n-layer 8 --n-embd 768
//       --n-head 12 --block-size 64] [--batch 4] [--steps 3] [--dtype bf16] [--fp32-norms] [--csv FILE]
//       [--check 0.02]
//
// Per configuration, on a fresh communicator (so the communicator's scratch is this
// configuration's): the GPT trained for --steps steps (the first is warm-up) by train_gpt's loop
// (GptScopes), then per rank the peak bytes by category from the engine's trackers and the process's
// communicator scratch, next to the ZeRO formula's prediction and the planner's (zero/plan: the
// engine on a meta device following the same loop's scopes); the median step time, tokens/s, the
// exposed communication (waits for gathers and reductions) and the bytes each rank sends per step
// (planned: the collectives the engine issues, at a ring's cost). Rank 0 prints the table and, with
// --csv, appends its rows. --check TOL exits 1 when any rank's planned category or total differs
// from the measured one by more than TOL (relative) and 64 KiB.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "tools/plan/report_columns.h"
#include "examples/bench_config.h"
#include "tools/cli/flags.h"
#include "examples/gpt/gpt_flags.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_plan.h"
#include "parallel/engine_comms.h"
#include "zero/engine.h"
#include "zero/plan/engine_plan.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;

using plan::report_column_names;
using plan::sum_of;

double mib(uint64_t b) { return static_cast<double>(b) / (1 << 20); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The worst relative difference of the plan from the measurement over the columns and the total,
// ignoring differences of at most 64 KiB.
double worst_difference(const std::vector<uint64_t>& measured, const std::vector<uint64_t>& planned) {
  std::vector<uint64_t> m = measured, p = planned;
  m.push_back(sum_of(measured));
  p.push_back(sum_of(planned));
  double worst = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(p[i]) - static_cast<double>(m[i]));
    if (diff <= 65536.0) continue;
    worst = std::max(worst, m[i] == 0 ? 1.0 : diff / static_cast<double>(m[i]));
  }
  return worst;
}

struct Row {
  std::string config;
  int world = 1;
  std::vector<uint64_t> measured, planned;
  uint64_t formula = 0;  // the ZeRO formula's device + host prediction (params, grads, master, state)
  double step_ms = 0, tokens_per_s = 0, exposed_ms = 0;
  uint64_t sent_per_step = 0;
  double worst = 0;  // over ranks
};

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  std::vector<examples::BenchConfig> configs;
  for (const std::string& c : flags.get_list("configs", "0,1,2,3,0+offload,1+offload,2+offload,3+offload")) {
    configs.push_back(examples::parse_bench_config(c));
  }
  const examples::GptConfig cfg =
      examples::gpt_config_from_flags(flags, {.block_size = 64, .n_embd = 768, .n_head = 12, .n_layer = 8});
  const int batch = flags.get_int("batch", 4);
  const int steps = flags.get_int("steps", 3);
  const DType dtype = parse_dtype(flags.get("dtype", "bf16"));
  const bool fp32_norms = flags.get_bool("fp32-norms", false);  // LayerNorms and biases fp32 beside bf16
  const std::string csv = flags.get("csv", "");
  const double check = flags.get_double("check", 0.0);
  flags.check_all_used();
  if (steps < 2) ZERO_THROW(InvalidArgument, "--steps {} must be at least 2 (the first is warm-up)", steps);

  comm::ProcessGroup pg = comm::init_process_group();
  const int rank = pg.host->rank(), world = pg.host->size();
  if (batch % world != 0) ZERO_THROW(InvalidArgument, "--batch {} is not a multiple of {} ranks", batch, world);
  const int local = batch / world, T = cfg.block_size;
  if (fp32_norms && dtype != DType::kBFloat16) ZERO_THROW(InvalidArgument, "--fp32-norms needs --dtype bf16");
  const plan::ModelSpec spec = examples::gpt_model_spec(cfg, dtype, 1, false, nullptr, fp32_norms);
  std::vector<Row> rows;
  const std::unique_ptr<comm::Communicator> alone = pg.host->split(rank, 0);  // tp 1 (the GPT's placements)
  for (const examples::BenchConfig& c : configs) {
    // A fresh communicator: its scratch starts from nothing, as the plan's does.
    std::unique_ptr<comm::Communicator> comm = pg.host->split(0, rank);
    memory::MemoryTracker::global().reset_peaks();
    EngineOptions opt = strategy::gpt2_engine_options(1e-4f);
    c.apply(opt);
    opt.grad_accum_dtype = dtype;
    Row row{c.name, world};
    {
      examples::Gpt model(cfg, 1);
      Engine engine(EngineComms{.shard = comm.get(), .finalizers = parallel::model_parallel_finalizers(*alone, nullptr)}, opt);
      examples::GptScopes scopes(engine, model, dtype, fp32_norms);
      engine.finalize();
      const examples::Gpt::Access access = scopes.access();
      std::mt19937 rng(static_cast<unsigned>(rank + 1));
      std::vector<int> x(static_cast<size_t>(local * T)), y(x.size());
      std::vector<double> times, exposed;
      for (int s = 0; s < steps; ++s) {
        for (size_t i = 0; i < x.size(); ++i) {
          x[i] = static_cast<int>(rng() % 256);
          y[i] = static_cast<int>(rng() % 256);
        }
        comm->barrier()->wait();
        const auto t0 = Clock::now();
        model.forward(x, y, local, T, access);
        model.backward(engine.loss_scale(), access);
        engine.finish_backward();
        engine.step();
        comm->barrier()->wait();
        if (s == 0) continue;
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        exposed.push_back(engine.step_timings().exposed_comm_s());
      }
      const MemoryReport report = engine.memory_report();
      row.measured = report.column_peaks();
      row.formula = report.formula_predicted() + report.host_predicted();
      row.step_ms = 1e3 * median(times);
      row.tokens_per_s = batch * T / median(times);
      row.exposed_ms = 1e3 * median(exposed);
    }
    const plan::EnginePlan planned = plan::plan_engine(
        {.model = spec, .options = opt, .world_size = world, .rank = rank, .finalizers = parallel::model_parallel_finalizers});
    row.planned = planned.memory.column_peaks();
    row.sent_per_step = planned.wire_bytes();
    row.worst = worst_difference(row.measured, row.planned);
    comm->all_reduce(&row.worst, 1, DType::kFloat64, comm::ReduceOp::kMax)->wait();
    rows.push_back(row);
  }

  if (rank == 0) {
    std::printf("zero_bench: GPT %d layers, n_embd %d, context %d, %s, %llu parameters; %d rank(s), global batch %d x %d "
                "tokens; rank 0's peak MiB by category (measured / planned), median of %d steps\n",
                cfg.n_layer, cfg.n_embd, T, fp32_norms ? "bf16 (fp32 norms and biases)" : dtype_name(dtype),
                static_cast<unsigned long long>(spec.numel()), world, batch, T,
                steps - 1);
    std::string head = fmt::format("{:<16} {:>3}", "config", "N");
    for (const std::string& col : report_column_names()) head += fmt::format(" {:>8}", col);
    head += fmt::format(" {:>9} {:>9} {:>9} {:>8} {:>8} {:>9} {:>8} {:>9} {:>10}", "total", "formula", "planned", "plan/m",
                        "worst", "step ms", "tok/s", "exposed", "sent/step");
    std::printf("%s\n", head.c_str());
    for (const Row& r : rows) {
      std::string line = fmt::format("{:<16} {:>3}", r.config, r.world);
      for (uint64_t v : r.measured) line += fmt::format(" {:>8.1f}", mib(v));
      line += fmt::format(" {:>9.1f} {:>9.1f} {:>9.1f} {:>8.4f} {:>8.4f} {:>9.1f} {:>8.0f} {:>9.1f} {:>10.1f}", mib(sum_of(r.measured)),
                          mib(r.formula), mib(sum_of(r.planned)),
                          static_cast<double>(sum_of(r.planned)) / static_cast<double>(sum_of(r.measured)), r.worst, r.step_ms,
                          r.tokens_per_s, r.exposed_ms, mib(r.sent_per_step));
      std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
    if (!csv.empty()) {
      const bool fresh = !std::filesystem::exists(csv);
      std::ofstream out(csv, std::ios::app);
      if (!out) ZERO_THROW(IoError, "--csv '{}': cannot open for appending", csv);
      if (fresh) {
        out << "config,world,params,n_layer,n_embd";
        for (const std::string& col : report_column_names()) out << "," << col << "_bytes";
        for (const std::string& col : report_column_names()) out << ",planned_" << col << "_bytes";
        out << ",formula_bytes,step_ms,tokens_per_s,exposed_comm_ms,sent_bytes_per_step,worst_plan_difference\n";
      }
      for (const Row& r : rows) {
        out << r.config << "," << r.world << "," << spec.numel() << "," << cfg.n_layer << "," << cfg.n_embd;
        for (uint64_t v : r.measured) out << "," << v;
        for (uint64_t v : r.planned) out << "," << v;
        out << "," << r.formula << "," << r.step_ms << "," << r.tokens_per_s << "," << r.exposed_ms << ","
            << r.sent_per_step << "," << r.worst << "\n";
      }
    }
  }
  int failed = 0;
  if (check > 0) {
    for (const Row& r : rows) {
      if (r.worst > check) {
        if (rank == 0) {
          std::fprintf(stderr, "zero_bench: %s at N = %d: the plan differs from the measurement by %.4f (more than %.4f)\n",
                       r.config.c_str(), r.world, r.worst, check);
        }
        failed = 1;
      }
    }
  }
  pg.host->barrier()->wait();
  return failed;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::cli::run_program("zero_bench", zero::run, argc, argv); }
