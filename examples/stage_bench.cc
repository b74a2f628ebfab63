// Stage 2 against stage 3 on the same model in one run: the MLP example's model and loop, one engine
// per stage on the same communicator, rounds alternating (2 3 3 2 ...). Prints per stage the median
// over rounds of the wall time per step, the median step's waits for all-gathers and reductions (the
// exposed communication) and its update time, and the gradient and parameter elements moved per
// step in units of Ψ:
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/stage_bench
//
// Stage 2 moves 2Ψ (reduce-scatter + all-gather); stage 3 moves 3Ψ when every unit is gathered again
// for backward, less when the gather window still holds it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "examples/flags.h"
#include "examples/mlp.h"
#include "zero/engine.h"

namespace {

using namespace zero;

struct Trainer {
  examples::Mlp model;
  std::unique_ptr<Engine> engine;
  std::vector<int> ids;
  std::optional<UnitScope> scope;
  examples::Mlp::Access access;
};

std::unique_ptr<Trainer> make_trainer(comm::Communicator& comm, int stage, const std::vector<int>& widths,
                                      size_t window_bytes, size_t prefetch_bytes) {
  auto t = std::make_unique<Trainer>(Trainer{examples::Mlp(widths, 1), nullptr, {}, std::nullopt, {}});
  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-3f}};
  opt.max_grad_norm = 1.0f;
  opt.max_live_gathered_bytes = window_bytes;
  opt.prefetch_bytes = prefetch_bytes;
  t->engine = std::make_unique<Engine>(comm, opt);
  for (size_t i = 0; i < t->model.params().size(); ++i) {
    auto& p = t->model.params()[i];
    t->ids.push_back(t->engine->add_param({.name = p.name, .shape = p.shape, .dtype = DType::kFloat32,
                                           .data = {p.values.data(), p.values.size()}, .unit = static_cast<int>(i / 2)}));
  }
  t->engine->finalize();
  Trainer* raw = t.get();
  t->access.enter = [raw](size_t l, bool backward) {
    raw->scope.emplace(backward ? raw->engine->gather_for_backward(static_cast<int>(l)) : raw->engine->gather(static_cast<int>(l)));
  };
  t->access.leave = [raw](size_t, bool) { raw->scope->close(); };
  t->access.param = [raw](size_t i) { return raw->scope->param_as<float>(raw->ids[i]); };
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int run(int argc, char** argv) {
  examples::Flags flags(argc, argv);
  const int rounds = flags.get_int("rounds", 6);
  const int steps = flags.get_int("steps", 10);
  const int hidden = flags.get_int("hidden", 1024);
  const int layers = flags.get_int("layers", 4);
  const int batch = flags.get_int("batch", 64);
  const size_t window = static_cast<size_t>(flags.get_int("window-kib", 0)) * 1024;
  const size_t prefetch = static_cast<size_t>(flags.get_int("prefetch-kib", 0)) * 1024;
  flags.check_all_used();

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& comm = *pg.host;
  const int rank = comm.rank(), world = comm.size();
  std::vector<int> widths{64};
  for (int l = 0; l < layers; ++l) widths.push_back(hidden);
  widths.push_back(10);
  std::unique_ptr<Trainer> trainers[2] = {make_trainer(comm, 2, widths, window, prefetch),
                                      make_trainer(comm, 3, widths, window, prefetch)};
  const double psi = static_cast<double>(trainers[0]->model.num_params());
  examples::SyntheticData data(64, 10, 7);
  examples::Matrix x;
  std::vector<int> labels;

  struct Stats {
    std::vector<double> step_s, gather_s, reduce_s, optimizer_s;
    double moved = 0;
  } stats[2];
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const int which = (round % 2 == 0) ? k : 1 - k;
      Trainer& t = *trainers[which];
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
        const StepTimings& st = t.engine->step_timings();
        stats[which].gather_s.push_back(st.gather_wait_s);
        stats[which].reduce_s.push_back(st.reduce_wait_s);
        stats[which].optimizer_s.push_back(st.optimizer_s);
        // Elements moved: gathered parameters plus reduced gradients (fp32 here: 4 bytes each).
        stats[which].moved = static_cast<double>(st.gathered_bytes + st.reduced_bytes) / 4.0 / psi;
      }
      comm.barrier()->wait();
      stats[which].step_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps);
    }
  }
  if (rank == 0) {
    std::printf("MLP %d x %d hidden (%.0f parameters), batch %d, %d ranks, %d rounds x %d steps\n", layers, hidden, psi,
                batch, world, rounds, steps);
    std::printf("%-6s %10s %16s %16s %14s %12s\n", "stage", "ms/step", "gather wait ms", "reduce wait ms",
                "optimizer ms", "moved / Ψ");
    for (int k = 0; k < 2; ++k) {
      const Stats& s = stats[k];
      std::printf("%-6d %10.2f %16.2f %16.2f %14.2f %12.2f\n", k + 2, 1e3 * median(s.step_s), 1e3 * median(s.gather_s),
                  1e3 * median(s.reduce_s), 1e3 * median(s.optimizer_s), s.moved);
    }
    std::printf("stage 3 / stage 2 step time: %.3f\n", median(stats[1].step_s) / median(stats[0].step_s));
  }
  comm.barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::examples::run_program("stage_bench", run, argc, argv); }
