// Engine configurations side by side on the same model in one run: the MLP example's model and
// loop, one engine per configuration on the same communicator, rounds alternating (a b b a ...).
// A configuration is a stage, optionally with "+offload" (the optimizer in the host tier) or
// "+offload-params" (stage 3: the parameter shard too):
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/stage_bench [--configs 2,3]
//   ... --configs 2,2+offload        (offload against none; also 1, 3, 3+offload-params)
//
// Per configuration: the median over rounds of the wall time per step; the median step's waits for
// all-gathers and reductions (the exposed communication) and its update time (norm, optimizer,
// parameter writeback), its wait for the new parameters' all-gathers (stages 1, 2) and with offload
// its other parts (gradient copies to the host, the CPU optimizer, copies of new parameters back),
// with the parts' sum over the update's wall time (above 1: that much of the parts overlapped;
// below 1: the rest is the norm and other work); the gradient and parameter elements moved per step in units
// of Ψ (stage 2 moves 2Ψ, stage 3 3Ψ when every unit is gathered again for backward, less when the
// gather window still holds it); and the step time over the first configuration's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "examples/bench_config.h"
#include "tools/cli/flags.h"
#include "examples/mlp.h"
#include "examples/mlp_engine.h"
#include "zero/engine.h"

namespace {

using namespace zero;

struct Trainer {
  examples::Mlp model;
  std::unique_ptr<Engine> engine;
  std::vector<int> ids;
  examples::Mlp::Access access;
};

using Config = examples::BenchConfig;

std::unique_ptr<Trainer> make_trainer(comm::Communicator& comm, const Config& config, const std::vector<int>& widths,
                                      size_t window_bytes, size_t prefetch_bytes) {
  auto t = std::make_unique<Trainer>(Trainer{examples::Mlp(widths, 1), nullptr, {}, {}});
  EngineOptions opt;
  config.apply(opt);
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-3f}};
  opt.max_grad_norm = 1.0f;
  opt.max_live_gathered_bytes = window_bytes;
  opt.prefetch_bytes = prefetch_bytes;
  t->engine = std::make_unique<Engine>(comm, opt);
  t->ids = examples::register_mlp(*t->engine, t->model);
  t->engine->finalize();
  t->access = examples::unit_scope_access(*t->engine, t->ids);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const int rounds = flags.get_int("rounds", 6);
  const int steps = flags.get_int("steps", 10);
  const int hidden = flags.get_int("hidden", 1024);
  const int layers = flags.get_int("layers", 4);
  const int batch = flags.get_int("batch", 64);
  const size_t window = static_cast<size_t>(flags.get_int("window-kib", 0)) * 1024;
  const size_t prefetch = static_cast<size_t>(flags.get_int("prefetch-kib", 0)) * 1024;
  std::vector<Config> configs;
  for (const std::string& c : flags.get_list("configs", "2,3")) configs.push_back(examples::parse_bench_config(c));
  flags.check_all_used();
  const size_t nc = configs.size();

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& comm = *pg.host;
  const int rank = comm.rank(), world = comm.size();
  std::vector<int> widths{64};
  for (int l = 0; l < layers; ++l) widths.push_back(hidden);
  widths.push_back(10);
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (const Config& c : configs) trainers.push_back(make_trainer(comm, c, widths, window, prefetch));
  const double psi = static_cast<double>(trainers[0]->model.num_params());
  examples::SyntheticData data(64, 10, 7);
  examples::Matrix x;
  std::vector<int> labels;

  struct Stats {
    std::vector<double> step_s, gather_s, reduce_s, update_s, ag_s, d2h_s, cpu_s, h2d_s;
    double moved = 0;
  };
  std::vector<Stats> stats(nc);
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < nc; ++k) {
      const size_t which = (round % 2 == 0) ? k : nc - 1 - k;
      Trainer& t = *trainers[which];
      Stats& st = stats[which];
      // The round's wall time per step, from a barrier to a barrier: it includes what a step leaves
      // running into the next (stage 3's prefetch of the next step's first units).
      comm.barrier()->wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) {
        data.batch(s, static_cast<int64_t>(rank) * (batch / world), batch / world, &x, &labels);
        t.model.forward(x, labels, t.access);
        t.model.backward(
            1.0f, [&](size_t i) { return t.engine->grad_as<float>(t.ids[i]); }, [](size_t) {}, t.access);
        t.engine->step();
        const StepTimings& tm = t.engine->step_timings();
        st.gather_s.push_back(tm.gather_wait_s);
        st.reduce_s.push_back(tm.reduce_wait_s);
        st.update_s.push_back(tm.optimizer_s);
        st.ag_s.push_back(tm.writeback_wait_s);
        st.d2h_s.push_back(tm.offload_d2h_s);
        st.cpu_s.push_back(tm.offload_cpu_s);
        st.h2d_s.push_back(tm.offload_h2d_s);
        // Elements moved: gathered parameters plus reduced gradients (fp32 here: 4 bytes each).
        st.moved = static_cast<double>(tm.gathered_bytes + tm.reduced_bytes) / 4.0 / psi;
      }
      comm.barrier()->wait();
      st.step_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps);
    }
  }
  if (rank == 0) {
    std::printf("MLP %d x %d hidden (%.0f parameters), batch %d, %d ranks, %d rounds x %d steps\n", layers, hidden, psi,
                batch, world, rounds, steps);
    std::printf("%-16s %9s %8s %8s %9s %8s %8s %8s %8s %11s %9s %10s\n", "config", "ms/step", "gather", "reduce",
                "update", "ag-wait", "d2h", "cpu", "h2d", "parts/upd", "moved/Ψ", "vs first");
    const double first = median(stats[0].step_s);
    for (size_t k = 0; k < nc; ++k) {
      const Stats& s = stats[k];
      const double update = median(s.update_s);
      const double parts = median(s.ag_s) + median(s.d2h_s) + median(s.cpu_s) + median(s.h2d_s);
      std::printf("%-16s %9.2f %8.2f %8.2f %9.2f %8.2f %8.2f %8.2f %8.2f %11.2f %9.2f %10.3f\n",
                  configs[k].name.c_str(), 1e3 * median(s.step_s), 1e3 * median(s.gather_s),
                  1e3 * median(s.reduce_s), 1e3 * update, 1e3 * median(s.ag_s), 1e3 * median(s.d2h_s),
                  1e3 * median(s.cpu_s), 1e3 * median(s.h2d_s),
                  update > 0 ? parts / update : 0.0, s.moved, median(s.step_s) / first);
    }
    std::printf("(ms; gather, reduce: waits in the step; update: the update's wall time, whose parts are ag-wait\n"
                " (waiting for the new parameters' all-gathers, stages 1-2) and, offloaded, d2h, cpu and h2d;\n"
                " parts/upd: their sum over the update's wall time)\n");
  }
  comm.barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("stage_bench", run, argc, argv); }
