// A small training run for the fault-injection tests (tests/fault_test.cc): the MLP example's model
// on synthetic data under zerorun, with one rank made to fail at a named point (base/fault_injection.h):
//
//   --fault POINT:ACTION[:N] --fault-rank R   the fault, armed on rank R only after finalize()
//   --timeout-s S                             the engine's and the communicator's deadline
//   --save DIR --save-every K                 a (synchronous) checkpoint every K steps
//   --resume DIR                              load DIR first and print the step it holds
//   --eager-bytes B                           the Gloo communicator's one-round limit
//
// Every rank prints "step N done"; an error ends the rank with its message (run_program), which is
// what the test reads.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "base/fault_injection.h"
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
  const int steps = flags.get_int("steps", 12);
  const std::string fault = flags.get("fault", "");
  const int fault_rank = flags.get_int("fault-rank", 1);
  const double timeout_s = flags.get_double("timeout-s", 10);
  const std::string save = flags.get("save", "");
  const int save_every = flags.get_int("save-every", 0);
  const std::string resume = flags.get("resume", "");
  // 0: every collective takes the pipelined path (none runs as one round of messages), so that a
  // fault inside a collective's sends is reachable with this small model.
  const int eager_bytes = flags.get_int("eager-bytes", -1);
  flags.check_all_used();

  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  comm::ProcessGroupOptions po;
  po.timeout = timeout;
  if (eager_bytes >= 0) po.gloo.eager_bytes = static_cast<size_t>(eager_bytes);
  comm::ProcessGroup pg = comm::init_process_group(po);
  comm::Communicator& comm = *pg.host;
  const int rank = comm.rank(), world = comm.size();

  examples::Mlp model({8, 64, 64, 4}, 1);
  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
  opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 16};
  opt.timeout = timeout;
  Engine engine(comm, opt);
  const std::vector<int> ids = examples::register_mlp(engine, model);
  engine.finalize();
  const examples::Mlp::Access access = examples::unit_scope_access(engine, ids);
  int start = 0;
  if (!resume.empty()) {
    start = static_cast<int>(engine.load(resume).state.step);
    if (rank == 0) std::printf("resumed at step %d\n", start);
  }
  if (!fault.empty() && rank == fault_rank) fault::arm(fault::parse_plan(fault));
  examples::SyntheticData data(8, 4, 7);
  examples::Matrix x;
  std::vector<int> labels;
  for (int s = start; s < steps; ++s) {
    data.batch(s, static_cast<int64_t>(rank) * 4, 4, &x, &labels);
    model.forward(x, labels, access);
    model.backward(1.0f, [&](size_t i) { return engine.grad_as<float>(ids[i]); }, [](size_t) {}, access);
    engine.finish_backward();
    engine.step();
    if (save_every > 0 && (s + 1) % save_every == 0) engine.save(save);
    std::printf("step %d done\n", s + 1);
    std::fflush(stdout);
  }
  (void)world;
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("fault_worker", run, argc, argv); }
