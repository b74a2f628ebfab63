// The tensor-parallel case of the fault-injection tests (tests/fault_test.cc, "killed in a
// tensor-parallel all-reduce"): the GPT example's model split over tp ranks, data parallel across the
// tp groups (the world is dp x tp), with one rank made to fail at a named point, usually
// "tp_collective" (base/fault_injection.h). Apart from fault_worker so that the sanitizer runs, which
// leave this case to the plain suite, do not build the GPT.
//
//   --tp T --stage S --steps N --fault POINT:ACTION[:N] --fault-rank R --timeout-s S
//
// Every rank prints "step N done"; an error ends the rank with its message (run_program).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/fault_injection.h"
#include "comm/launch/process_group.h"
#include "comm/mesh.h"
#include "examples/flags.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_model.h"
#include "zero/engine.h"

namespace {

using namespace zero;

// The GPT (2 layers, 4 heads) split over tp ranks, data parallel across the tp groups.
int train(comm::Communicator& world, int tp, int stage, int steps, std::chrono::milliseconds timeout,
            const std::string& fault, int fault_rank) {
  if (world.size() % tp != 0) ZERO_THROW(InvalidArgument, "--tp {} does not divide {} ranks", tp, world.size());
  comm::Mesh mesh(world, {.pp = 1, .dp = world.size() / tp, .tp = tp});
  const examples::GptConfig cfg{.vocab_size = 64, .block_size = 16, .n_embd = 32, .n_head = 4, .n_layer = 2};
  const examples::Gpt whole(cfg, 1);
  examples::Gpt model(whole, {&mesh.tp(), false});
  EngineOptions opt = examples::gpt_engine_options(1e-3f);
  opt.stage = stage;
  opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 16};
  opt.timeout = timeout;
  Engine engine(EngineComms{.shard = &mesh.dp(), .tp = &mesh.tp(), .model_parallel = &mesh.model_parallel()}, opt);
  examples::GptScopes scopes(engine, model);
  engine.finalize();
  const examples::Gpt::Access access = scopes.access();
  if (!fault.empty() && world.rank() == fault_rank) fault::arm(fault::parse_plan(fault));
  std::vector<int> tokens(2 * 16), targets(2 * 16);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int>((i * 7 + static_cast<size_t>(s) + static_cast<size_t>(mesh.dp().rank())) % 64);
      targets[i] = static_cast<int>((i * 5 + 3) % 64);
    }
    model.forward(tokens, targets, 2, 16, access);
    model.backward(1.0f, access);
    engine.finish_backward();
    engine.step();
    std::printf("step %d done\n", s + 1);
    std::fflush(stdout);
  }
  return 0;
}

int run(int argc, char** argv) {
  examples::Flags flags(argc, argv);
  const int tp = flags.get_int("tp", 2);
  const int stage = flags.get_int("stage", 2);
  const int steps = flags.get_int("steps", 12);
  const std::string fault = flags.get("fault", "");
  const int fault_rank = flags.get_int("fault-rank", 1);
  const double timeout_s = flags.get_double("timeout-s", 10);
  flags.check_all_used();
  if (tp < 1) ZERO_THROW(InvalidArgument, "--tp {} is not positive", tp);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  comm::ProcessGroupOptions po;
  po.timeout = timeout;
  comm::ProcessGroup pg = comm::init_process_group(po);
  return train(*pg.host, tp, stage, steps, timeout, fault, fault_rank);
}

}  // namespace

int main(int argc, char** argv) { return zero::examples::run_program("fault_worker", run, argc, argv); }
