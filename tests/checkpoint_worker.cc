// Trains the MLP example's model (synthetic data, 12 samples per global step) under zerorun, with
// checkpoints: --save-at S --dir D saves after step S; --resume D loads D first and continues. Each
// global step is 12 samples in 12 / (ranks x micro) sample chunks; chunk k of a step goes to rank
// k / micro, micro-step k % micro, so N ranks x 1 micro-step and 1 rank x N micro-steps add the same
// chunks in the same order. --export F writes the final weights (fp32) as safetensors.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "tools/cli/flags.h"
#include "examples/mlp.h"
#include "examples/mlp_engine.h"
#include "zero/engine.h"

namespace {

using namespace zero;

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const int stage = flags.get_int("stage", 2);
  const int micro = flags.get_int("micro", 1);
  const int steps = flags.get_int("steps", 6);
  const int save_at = flags.get_int("save-at", -1);
  const std::string dir = flags.get("dir", "");
  const std::string resume = flags.get("resume", "");
  const std::string export_path = flags.get("export", "");
  const bool deterministic = flags.get_bool("deterministic", true);
  const bool offload = flags.get_bool("offload", false);
  const int hidden = flags.get_int("hidden", 16);
  const std::string dump_params = flags.get("dump-params", "");
  const bool async = flags.get_bool("async", false);
  flags.check_all_used();

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& comm = *pg.host;
  const int rank = comm.rank(), world = comm.size();
  constexpr int kSamples = 12;
  if (kSamples % (world * micro) != 0) {
    ZERO_THROW(InvalidArgument, "{} ranks x {} micro-steps do not divide the {} samples of a step", world, micro,
               kSamples);
  }
  const int per = kSamples / (world * micro);

  examples::Mlp model({8, hidden, 16, 4}, 1);
  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.kind = optim::OptimizerKind::kAdamW;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
  opt.max_grad_norm = 0.5f;
  opt.deterministic = deterministic;
  opt.micro_batches = micro;
  opt.offload.optimizer = offload;
  opt.layout = {.alignment = 4, .bucket_numel = 96, .block = 16};
  Engine engine(comm, opt);
  const std::vector<int> ids = examples::register_mlp(engine, model);
  engine.finalize();
  const examples::Mlp::Access access = examples::unit_scope_access(engine, ids);

  int start = 0;
  if (!resume.empty()) {
    const LoadedCheckpoint c = engine.load(resume);
    start = static_cast<int>(c.state.step);
    // Every saving rank's blob says who wrote it and when.
    for (size_t r = 0; r < c.user_blobs.size(); ++r) {
      const std::string want = "rank " + std::to_string(r) + " after step " + std::to_string(start);
      ZERO_CHECK(c.user_blobs[r] == want, "user blob of rank {}: '{}' (expected '{}')", r, c.user_blobs[r], want);
    }
    ZERO_CHECK_EQ(static_cast<int>(c.user_blobs.size()), c.world_size);
    ZERO_CHECK_EQ(engine.steps_taken(), start);
    if (rank == 0) std::printf("resumed at step %d from %d ranks, stage %d\n", start, c.world_size, c.stage);
  }
  examples::SyntheticData data(8, 4, 7);
  examples::Matrix x;
  std::vector<int> labels;
  for (int s = start; s < steps; ++s) {
    for (int m = 0; m < micro; ++m) {
      const int chunk = rank * micro + m;
      data.batch(s, static_cast<int64_t>(chunk) * per, per, &x, &labels);
      model.forward(x, labels, access);
      model.backward(1.0f, [&](size_t i) { return engine.grad_as<float>(ids[i]); }, [](size_t) {}, access);
      engine.finish_backward();
    }
    engine.step();
    if (s + 1 == save_at) {
      const std::string blob = "rank " + std::to_string(rank) + " after step " + std::to_string(s + 1);
      if (async) {
        engine.save_async(dir, blob);  // written while the next steps train
      } else {
        engine.save(dir, blob);
      }
    }
  }
  engine.wait_for_save();
  if (!export_path.empty()) engine.export_safetensors(export_path);
  // Below stage 3 the model's own storage holds the full parameters: rank 0 dumps them raw, in
  // registration order, for the test to compare with the export.
  if (!dump_params.empty() && rank == 0) {
    std::FILE* f = std::fopen(dump_params.c_str(), "wb");
    ZERO_CHECK(f != nullptr, "cannot write {}", dump_params);
    for (const auto& p : model.params()) std::fwrite(p.values.data(), sizeof(float), p.values.size(), f);
    std::fclose(f);
  }
  if (rank == 0) std::printf("done at step %lld\n", static_cast<long long>(engine.steps_taken()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("checkpoint_worker", run, argc, argv); }
