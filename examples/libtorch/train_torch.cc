// A LibTorch training loop (torch::nn, autograd) whose torch::optim::AdamW is replaced by the engine
// through the adapter (adapters/libtorch), on as many ranks as the launcher starts:
//
//   bazel build --config=libtorch //examples/libtorch:train_torch //comm/launch:zerorun
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/libtorch/train_torch --stage 3
//   bazel-bin/examples/libtorch/train_torch --mode reference     # one process, torch::optim::AdamW
//
// Both modes train the same model (examples/libtorch/torch_mlp.h) from the same initial values on the
// same global batches: each rank takes its slice, the reference the whole batch. Rank 0 prints the
// global loss and the step's time split (forward, backward, the rest: the reductions still pending,
// the update, the new parameters' all-gather) per step, and the medians at the end. --dump FILE
// writes the final parameters (name, element count, fp32 values) for the tests.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "adapters/libtorch/torch_engine.h"
#include "base/check.h"
#include "base/error.h"
#include "comm/launch/process_group.h"
#include "tools/cli/flags.h"
#include "examples/libtorch/torch_mlp.h"
#include "zero/engine.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void dump(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  std::ofstream out(path, std::ios::binary);
  if (!out) ZERO_THROW(zero::IoError, "--dump: cannot write '{}'", path);
  for (const auto& [name, t] : params) {
    const torch::Tensor c = t.contiguous();
    const uint32_t n = static_cast<uint32_t>(name.size());
    const uint64_t numel = static_cast<uint64_t>(c.numel());
    out.write(reinterpret_cast<const char*>(&n), sizeof n);
    out.write(name.data(), n);
    out.write(reinterpret_cast<const char*>(&numel), sizeof numel);
    out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(numel * sizeof(float)));
  }
  if (!out) ZERO_THROW(zero::IoError, "--dump: writing '{}' failed", path);
}

int64_t parameter_count(const torch::nn::Sequential& model) {
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

struct Times {
  std::vector<double> fwd, bwd, rest, step, optimizer, exposed;
  void print(const char* what) const {
    // The first step is left out (allocations, the stage-3 order being recorded).
    auto tail = [](const std::vector<double>& v) { return std::vector<double>(v.begin() + (v.size() > 1), v.end()); };
    std::printf("%s: median step %.2f ms (forward %.2f, backward %.2f, outside forward/backward %.2f", what,
                median(tail(step)), median(tail(fwd)), median(tail(bwd)), median(tail(rest)));
    if (!optimizer.empty()) {
      std::printf("; engine: update %.2f, exposed communication %.2f", median(tail(optimizer)), median(tail(exposed)));
    }
    std::printf(") over %zu steps\n", step.size() - (step.size() > 1));
  }
};

int run(int argc, char** argv) {
  using namespace zero;
  cli::Flags flags(argc, argv);
  const std::string mode = flags.get("mode", "engine");
  examples::TorchMlpConfig cfg;
  cfg.inputs = flags.get_int("inputs", 32);
  cfg.hidden = flags.get_int("hidden", 64);
  cfg.ff = flags.get_int("ff", 256);
  cfg.blocks = flags.get_int("blocks", 3);
  cfg.classes = flags.get_int("classes", 10);
  const int steps = flags.get_int("steps", 20);
  const int batch = flags.get_int("batch", 32);
  const int seed = flags.get_int("seed", 1);
  const float lr = static_cast<float>(flags.get_double("lr", 1e-3));
  const float weight_decay = static_cast<float>(flags.get_double("weight-decay", 0.01));
  const float max_grad_norm = static_cast<float>(flags.get_double("max-grad-norm", 0.0));
  const int threads = flags.get_int("threads", 1);
  const std::string dump_path = flags.get("dump", "");
  const bool quiet = flags.get_bool("quiet", false);
  const int stage = flags.get_int("stage", 2);
  const int bucket_kib = flags.get_int("bucket-kib", 16384);
  const bool reshard = flags.get_bool("reshard-after-forward", true);
  // Stage 3's gather window (0: the engine's default, two of the largest unit). Without resharding
  // after forward every unit stays gathered until its backward, so the window must hold them all.
  const int window_kib = flags.get_int("window-kib", 0);
  const int inflight = flags.get_int("inflight-buckets", 2);
  const bool report = flags.get_bool("memory-report", false);
  flags.check_all_used();
  if (mode != "engine" && mode != "reference") ZERO_THROW(InvalidArgument, "--mode: '{}' is not engine or reference", mode);
  torch::set_num_threads(threads);
  Times times;

  if (mode == "reference") {
    // LibTorch's own loop on the whole batch, the loop the engine's replaces.
    torch::manual_seed(static_cast<uint64_t>(seed));
    torch::nn::Sequential model = examples::make_torch_mlp(cfg);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(lr).weight_decay(weight_decay));
    std::printf("reference: LibTorch %s, %lld parameters, torch::optim::AdamW, 1 process, batch %d\n", TORCH_VERSION,
                static_cast<long long>(parameter_count(model)), batch);
    for (int step = 0; step < steps; ++step) {
      const examples::TorchBatch b = examples::torch_mlp_batch(cfg, batch, static_cast<uint64_t>(seed), step);
      const auto t0 = Clock::now();
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(b.x), b.labels);
      times.fwd.push_back(ms_since(t0));
      const auto t1 = Clock::now();
      opt.zero_grad();
      loss.backward();
      times.bwd.push_back(ms_since(t1));
      const auto t2 = Clock::now();
      if (max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), max_grad_norm);
      opt.step();
      times.rest.push_back(ms_since(t2));
      times.step.push_back(ms_since(t0));
      if (!quiet) std::printf("step %3d  loss %.9e\n", step + 1, loss.item<double>());
    }
    times.print("reference");
    if (!dump_path.empty()) {
      std::vector<std::pair<std::string, torch::Tensor>> params;
      for (const auto& p : model->named_parameters()) params.emplace_back(p.key(), p.value().detach());
      dump(dump_path, params);
    }
    return 0;
  }

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& comm = *pg.host;
  const int rank = comm.rank(), world = comm.size();
  if (batch % world != 0) ZERO_THROW(InvalidArgument, "--batch {} is not divisible by the world size {}", batch, world);
  const int64_t local = batch / world;

  // Different initial values per rank on purpose: finalize() broadcasts rank 0's.
  torch::manual_seed(static_cast<uint64_t>(seed + 17 * rank));
  torch::nn::Sequential model = examples::make_torch_mlp(cfg);

  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.kind = optim::OptimizerKind::kAdamW;
  opt.optimizer.groups = {optim::Hyper{.lr = lr, .weight_decay = weight_decay}};  // torch's defaults otherwise
  opt.max_grad_norm = max_grad_norm;
  opt.layout.bucket_numel = static_cast<size_t>(bucket_kib) * 1024 / sizeof(float);
  opt.reshard_after_forward = reshard;
  opt.max_live_gathered_bytes = static_cast<size_t>(window_kib) * 1024;
  opt.max_inflight_buckets = inflight;
  Engine engine(comm, opt);
  libtorch::TorchEngine zt(engine, *model);  // one unit per child of the Sequential
  zt.finalize();
  if (rank == 0) {
    std::printf("engine: LibTorch %s, %lld parameters, %d rank(s), stage %d, %d units, batch %d (%lld per rank)\n",
                TORCH_VERSION, static_cast<long long>(parameter_count(model)), world, stage, zt.num_units(), batch,
                static_cast<long long>(local));
  }

  for (int step = 0; step < steps; ++step) {
    const examples::TorchBatch b = examples::torch_mlp_batch(cfg, batch, static_cast<uint64_t>(seed), step);
    const torch::Tensor x = b.x.narrow(0, rank * local, local), y = b.labels.narrow(0, rank * local, local);
    comm.barrier()->wait();
    const auto t0 = Clock::now();
    torch::Tensor loss = torch::nn::functional::cross_entropy(zt.forward(model, x), y);
    times.fwd.push_back(ms_since(t0));
    const auto t1 = Clock::now();
    loss.backward();  // the buckets reduce from the gradient hooks, during autograd
    times.bwd.push_back(ms_since(t1));
    const auto t2 = Clock::now();
    zt.finish_backward();
    const StepResult r = zt.step();
    comm.barrier()->wait();
    times.rest.push_back(ms_since(t2));
    times.step.push_back(ms_since(t0));
    times.optimizer.push_back(engine.step_timings().optimizer_s * 1e3);
    times.exposed.push_back(engine.step_timings().exposed_comm_s() * 1e3);
    double l = loss.item<double>();
    comm.all_reduce(&l, 1, DType::kFloat64, comm::ReduceOp::kAvg)->wait();
    if (rank == 0 && !quiet) std::printf("step %3d  loss %.9e  grad_norm %.6f\n", step + 1, l, r.grad_norm);
  }
  const auto params = zt.full_parameters();
  if (rank == 0) {
    times.print(("engine stage " + std::to_string(stage)).c_str());
    if (!dump_path.empty()) dump(dump_path, params);
  }
  if (report) {
    comm.barrier()->wait();
    std::fflush(stdout);
    std::printf("%s", engine.memory_report().table().c_str());
  }
  std::fflush(stdout);
  comm.barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("train_torch", run, argc, argv); }
