// Per-rank memory at a ZeRO stage, measured against the formula. Run under the launcher:
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 4 -- bazel-bin/examples/memory_bench --stage 2
//
// Registers a synthetic model of 16-bit parameters (Adam, fp32 master weights and state), takes a few
// steps with synthetic gradients, and prints each rank's memory report: params + grads + optimizer
// state against 16Ψ / 4Ψ + 12Ψ/N / 2Ψ + 14Ψ/N / 16Ψ/N, with the bucket buffers listed separately.
// With --offload the master and state are in the host tier: the device against 4Ψ / 2Ψ + 2Ψ/N /
// 4Ψ/N (stages 1 / 2 / 3) and the host tier against 12Ψ/N; with --offload-params (stage 3) the
// parameter shard moves too: 2Ψ/N on the device, 14Ψ/N on the host. Exits 1 when a measured total is more than
// --tolerance away from its formula.
#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "tools/cli/flags.h"
#include "zero/engine.h"

namespace {

int run(int argc, char** argv) {
  using namespace zero;
  cli::Flags flags(argc, argv);
  const int stage = flags.get_int("stage", 2);
  const double millions = flags.get_double("params-m", 16.0);
  const int tensors = flags.get_int("tensors", 16);
  const int steps = flags.get_int("steps", 2);
  const std::string dtype_name = flags.get("dtype", "bf16");
  const double tolerance = flags.get_double("tolerance", 0.05);
  const int bucket_m = flags.get_int("bucket-m", 2);
  const bool offload = flags.get_bool("offload", false);
  const bool offload_params = flags.get_bool("offload-params", false);
  flags.check_all_used();

  const DType dtype = parse_dtype(dtype_name);
  if (!is_float16_family(dtype)) ZERO_THROW(InvalidArgument, "--dtype must be fp16 or bf16, got {}", dtype_name);
  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& comm = *pg.host;
  const int rank = comm.rank();

  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.kind = optim::OptimizerKind::kAdam;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-4f}};
  opt.reduce_dtype = DType::kFloat32;
  opt.grad_accum_dtype = dtype;  // a 16-bit gradient shard: 2Ψ + 14Ψ/N at stage 2
  opt.max_grad_norm = 1.0f;
  opt.layout.bucket_numel = static_cast<size_t>(bucket_m) << 20;
  opt.offload.optimizer = offload || offload_params;
  opt.offload.params = offload_params;
  Engine engine(comm, opt);

  const size_t total = static_cast<size_t>(millions * 1e6);
  const size_t per = total / static_cast<size_t>(tensors);
  std::vector<std::vector<uint16_t>> params(static_cast<size_t>(tensors));
  std::vector<int> ids;
  for (int t = 0; t < tensors; ++t) {
    auto& p = params[static_cast<size_t>(t)];
    p.assign(per, fp32_to_bf16_bits(0.01f * static_cast<float>(t + 1)));
    if (dtype == DType::kFloat16) p.assign(per, fp32_to_fp16_bits(0.01f * static_cast<float>(t + 1)));
    ids.push_back(engine.add_param({.name = "w" + std::to_string(t),
                                    .shape = {static_cast<int64_t>(per)},
                                    .dtype = dtype,
                                    .data = {p.data(), p.size()},
                                    .unit = t}));  // each tensor a unit: the stage 3 window holds two
  }
  engine.finalize();

  for (int s = 0; s < steps; ++s) {
    for (int t = tensors; t-- > 0;) {
      // Each unit's backward scope: at stage 3 its parameters are gathered there and its gradient
      // exists only there; leaving the scope marks it complete.
      UnitScope backward = engine.gather_for_backward(t);
      auto* g = backward.grad_as<uint16_t>(ids[static_cast<size_t>(t)]);
      const float v = 1e-3f * static_cast<float>((t + rank + s) % 7 + 1);
      const uint16_t bits = dtype == DType::kBFloat16 ? fp32_to_bf16_bits(v) : fp32_to_fp16_bits(v);
      for (size_t i = 0; i < per; ++i) g[i] = bits;
    }
    engine.step();
  }
  const MemoryReport report = engine.memory_report();
  // Print rank by rank so the tables do not interleave.
  for (int r = 0; r < comm.size(); ++r) {
    if (r == rank) {
      std::printf("%s", report.table().c_str());
      std::fflush(stdout);
    }
    comm.barrier()->wait();
  }
  int failed = 0;
  auto check = [&](const char* what, double ratio) {
    if (std::fabs(ratio - 1.0) > tolerance) {
      std::fprintf(stderr, "rank %d: %s measured/predicted %.3f is outside 1 +- %.2f\n", rank, what, ratio, tolerance);
      failed = 1;
    }
  };
  check(report.offloaded() ? "device" : "", report.ratio());
  if (report.offloaded()) check("host tier", report.host_ratio());
  return failed;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("memory_bench", run, argc, argv); }
