// One rank of the engine behaviour tests (driven by engine_test.cc). Each scenario prints lines
// "RESULT ..." that the driver checks, and exits non-zero with the error message on failure.
//
//   mismatch        rank 1 registers a different shape: finalize() must fail on every rank
//   bad-grad        rank 0 passes gradient storage of the wrong size: fails on every rank
//   early-step      step() before finalize()
//   rank-exits      rank 1 leaves after finalize(); rank 0's step() must fail, not hang
//   overflow        16-bit parameters, dynamic loss scaling; rank 1 has an inf gradient at step 2:
//                   the step is skipped on every rank, the scale backs off, training goes on
//   mixed           16-bit parameters, fp32 master weights: prints a digest of the parameters so the
//                   driver can compare stages and ranks
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "tools/cli/flags.h"
#include "zero/engine.h"

namespace {

using namespace zero;

uint64_t digest(const std::vector<uint16_t>& v) {
  uint64_t h = 1469598103934665603ull;
  for (uint16_t x : v) h = (h ^ x) * 1099511628211ull;
  return h;
}

// A two-tensor model: w [rows, cols] and b [cols], with synthetic gradients that depend on the rank
// and the step.
struct Model {
  DType dtype;
  std::vector<uint16_t> w, b;  // 16-bit storage
  std::vector<float> w32, b32;  // fp32 storage (dtype fp32)
};

void fill_grad(void* g, DType dtype, size_t n, int rank, int step, bool inf) {
  for (size_t i = 0; i < n; ++i) {
    float v = 0.01f * static_cast<float>((static_cast<int>(i) * 7 + rank * 3 + step) % 11 - 5);
    if (inf && i == n / 2) v = INFINITY;
    if (dtype == DType::kFloat32) {
      static_cast<float*>(g)[i] += v;
    } else {
      auto* h = static_cast<uint16_t*>(g);
      const float cur = dtype == DType::kBFloat16 ? bf16_bits_to_fp32(h[i]) : fp16_bits_to_fp32(h[i]);
      h[i] = dtype == DType::kBFloat16 ? fp32_to_bf16_bits(cur + v) : fp32_to_fp16_bits(cur + v);
    }
  }
}

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const std::string scenario = flags.get("scenario", "");
  const int stage = flags.get_int("stage", 2);
  const std::string dtype_name = flags.get("dtype", "bf16");
  const bool deterministic = flags.get_bool("deterministic", false);
  const int steps = flags.get_int("steps", 4);

  comm::ProcessGroupOptions pgo;
  pgo.timeout = std::chrono::seconds(20);
  comm::ProcessGroup pg = comm::init_process_group(pgo);
  comm::Communicator& comm = *pg.host;
  const int rank = comm.rank();

  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.kind = optim::OptimizerKind::kAdamW;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
  opt.max_grad_norm = 1.0f;
  opt.deterministic = deterministic;
  opt.timeout = std::chrono::seconds(20);
  opt.layout = {.alignment = 16, .bucket_numel = 4096, .block = 256};
  const DType dtype = parse_dtype(dtype_name);
  opt.reduce_dtype = DType::kFloat32;
  // Stages 0 and 1 keep the reduced 16-bit gradients in the model dtype; a stage 2 shard of the
  // same dtype makes the stages agree bit for bit (an fp32 shard keeps more precision).
  opt.grad_accum_dtype = flags.get_bool("accum-fp32", false) ? DType::kFloat32 : dtype;
  flags.check_all_used();
  if (scenario == "overflow") {
    opt.loss_scaling = LossScaling::kDynamic;
    opt.dynamic_loss_scaler.initial_scale = 1024.0f;
    opt.dynamic_loss_scaler.hysteresis = 1;
  }
  Engine engine(comm, opt);

  if (scenario == "early-step") {
    engine.step();
    return 0;
  }

  const int64_t rows = 50, cols = 100;
  std::vector<uint16_t> w(static_cast<size_t>(rows * cols)), b(static_cast<size_t>(cols));
  for (size_t i = 0; i < w.size(); ++i) {
    const float v = 0.02f * static_cast<float>(static_cast<int>(i % 13) - 6);
    w[i] = dtype == DType::kBFloat16 ? fp32_to_bf16_bits(v) : fp32_to_fp16_bits(v);
  }
  std::vector<int64_t> w_shape{rows, cols};
  if (scenario == "mismatch" && rank == 1) w_shape = {cols, rows};
  std::vector<uint16_t> user_grad(b.size() - (scenario == "bad-grad" && rank == 0 ? 1 : 0));
  const int wid = engine.add_param({.name = "w", .shape = w_shape, .dtype = dtype, .data = {w.data(), w.size()}});
  const int bid = engine.add_param({.name = "b", .shape = {cols}, .dtype = dtype, .data = {b.data(), b.size()},
                                    .grad = {user_grad.data(), user_grad.size()}});
  engine.finalize();
  if (scenario == "rank-exits" && rank == 1) {
    std::printf("RESULT rank 1 leaving\n");
    std::fflush(stdout);
    std::_Exit(0);
  }

  // The parameters as the loop sees them: through the unit's gather scope (at stage 3 the engine
  // owns them and the registered storage keeps the initial values).
  auto current = [&] {
    UnitScope scope = engine.gather(0);
    const auto* pw = scope.param_as<uint16_t>(wid);
    const auto* pb = scope.param_as<uint16_t>(bid);
    return std::make_pair(std::vector<uint16_t>(pw, pw + w.size()), std::vector<uint16_t>(pb, pb + b.size()));
  };
  for (int s = 0; s < steps; ++s) {
    const bool inf = scenario == "overflow" && s == 1 && rank == 1;
    {
      // Gradients are written inside the unit's backward scope (at stage 3 they exist only there);
      // grad_ready() marks each complete before the scope ends.
      UnitScope backward = engine.gather_for_backward(0);
      fill_grad(engine.grad(bid), dtype, b.size(), rank, s, false);
      engine.grad_ready(bid);
      fill_grad(engine.grad(wid), dtype, w.size(), rank, s, inf);
      engine.grad_ready(wid);
    }
    const std::vector<uint16_t> before = current().first;
    const StepResult r = engine.step();
    std::printf("RESULT step %d skipped %d scale %g next_scale %g unchanged %d\n", s + 1, r.skipped ? 1 : 0,
                r.loss_scale, engine.loss_scale(), before == current().first ? 1 : 0);
  }
  const auto [final_w, final_b] = current();
  std::printf("RESULT digest %016llx %016llx\n", static_cast<unsigned long long>(digest(final_w)),
              static_cast<unsigned long long>(digest(final_b)));
  comm.barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::printf("RESULT error: %s\n", e.what());
    return 1;
  }
}
