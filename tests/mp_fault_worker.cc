// The model-parallel cases of the fault-injection tests (tests/fault_test.cc, "killed in a
// tensor-parallel all-reduce", "... mid-pipeline"): the GPT example's model split over tp ranks or
// over pipeline stages (1F1B over 4 micro-batches), data parallel across the copies (the world is
// pp x dp x tp), with one rank made to fail at a named point, usually "tp_collective" or
// "pipeline_action" (base/fault_injection.h). Apart from fault_worker so that the sanitizer runs,
// which leave these cases to the plain suite, do not build the GPT.
//
//   --tp T --pp P --stage S --steps N --fault POINT:ACTION[:N] --fault-rank R --timeout-s S
//
// Every rank prints "step N done"; an error ends the rank with its message (run_program).
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/fault_injection.h"
#include "comm/launch/process_group.h"
#include "comm/mesh.h"
#include "tools/cli/flags.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/gpt_pipeline.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/schedules.h"
#include "zero/engine.h"

namespace {

using namespace zero;

// The GPT (2 layers, 4 heads) split over tp ranks and pp stages, data parallel across the copies.
int train(comm::Communicator& world, int tp, int pp, int stage, int steps, std::chrono::milliseconds timeout,
          const std::string& fault, int fault_rank) {
  if (world.size() % (tp * pp) != 0) {
    ZERO_THROW(InvalidArgument, "--tp {} x --pp {} does not divide {} ranks", tp, pp, world.size());
  }
  comm::Mesh mesh(world, comm::MeshShape{.pp = pp, .dp = world.size() / (tp * pp), .tp = tp});
  const examples::GptConfig cfg{.vocab_size = 64, .block_size = 16, .n_embd = 32, .n_head = 4, .n_layer = 2};
  const examples::Gpt whole(cfg, 1);
  const examples::GptParallel parallel{tp > 1 ? &mesh.tp() : nullptr, false};
  constexpr int kMicroBatches = 4;
  EngineOptions opt = strategy::gpt2_engine_options(1e-3f);
  opt.stage = stage;
  opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 16};
  opt.timeout = timeout;
  if (pp > 1) opt.micro_batches = kMicroBatches;
  Engine engine(parallel::engine_comms(mesh), opt);
  std::optional<examples::Gpt> model;
  std::unique_ptr<examples::GptScopes> scopes;
  std::unique_ptr<examples::GptPipeline> pipe;
  if (pp > 1) {
    pipe = std::make_unique<examples::GptPipeline>(whole, parallel, mesh,
                                                   parallel::one_f_one_b(pp, kMicroBatches), std::vector<int>{}, engine);
  } else {
    model.emplace(whole, parallel);
    scopes = std::make_unique<examples::GptScopes>(engine, *model);
  }
  pipe ? pipe->finalize() : engine.finalize();
  if (!fault.empty() && world.rank() == fault_rank) fault::arm(fault::parse_plan(fault));
  std::vector<int> tokens(2 * 16), targets(2 * 16);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int>((i * 7 + static_cast<size_t>(s) + static_cast<size_t>(mesh.dp().rank())) % 64);
      targets[i] = static_cast<int>((i * 5 + 3) % 64);
    }
    if (pipe) {
      pipe->train_step(std::vector<examples::MicroBatch>(kMicroBatches, {tokens, targets, 2, 16}), 1.0f);
    } else {
      model->forward(tokens, targets, 2, 16, scopes->access());
      model->backward(1.0f, scopes->access());
    }
    engine.finish_backward();
    engine.step();
    std::printf("step %d done\n", s + 1);
    std::fflush(stdout);
  }
  return 0;
}

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const int tp = flags.get_int("tp", 2);
  const int pp = flags.get_int("pp", 1);
  const int stage = flags.get_int("stage", 2);
  const int steps = flags.get_int("steps", 12);
  const std::string fault = flags.get("fault", "");
  const int fault_rank = flags.get_int("fault-rank", 1);
  const double timeout_s = flags.get_double("timeout-s", 10);
  flags.check_all_used();
  if (tp < 1 || pp < 1) ZERO_THROW(InvalidArgument, "--tp {} and --pp {} must be positive", tp, pp);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  comm::ProcessGroupOptions po;
  po.timeout = timeout;
  comm::ProcessGroup pg = comm::init_process_group(po);
  return train(*pg.host, tp, pp, stage, steps, timeout, fault, fault_rank);
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("fault_worker", run, argc, argv); }
