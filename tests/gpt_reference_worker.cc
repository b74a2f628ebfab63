// The GPT example's model against a PyTorch reference file (tests/data/pytorch/gpt format): "check",
// one forward and backward at the initial parameters (the loss within 1e-6 relative, every gradient
// tensor within 1e-5 x its largest magnitude), then "train", the data-parallel run through the
// engine (per-rank losses within 1e-5 relative, the gradient norm, every parameter within 2e-4
// absolute after every step), at any stage. Run under zerorun with the file's world size, or a
// divisor of it (micro-steps make up the rest), times --tp: the ranks form a (dp, tp) mesh, each
// holding its tensor-parallel part of the model (--sequence-parallel: the residual stream split
// along the sequence too), compared with the same part of PyTorch's tensors (the padding rows of a
// vocabulary tp does not divide must stay zero). Prints whether it matches; any file of the format
// works, so a new reference needs no new code.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "comm/mesh.h"
#include "examples/flags.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/gpt_reference.h"
#include "zero/engine.h"
#include "zero/tp_placement.h"

namespace {

using namespace zero;
using json = nlohmann::json;

int run(int argc, char** argv) {
  examples::Flags flags(argc, argv);
  const std::string file = flags.get("file", "");
  const int stage = flags.get_int("stage", 2);
  const bool offload = flags.get_bool("offload", false);
  const int tp = flags.get_int("tp", 1);
  const bool sequence_parallel = flags.get_bool("sequence-parallel", false);
  flags.check_all_used();
  if (tp < 1) ZERO_THROW(InvalidArgument, "--tp {} is not positive", tp);
  std::ifstream in(file);
  if (!in) ZERO_THROW(IoError, "cannot open reference file '{}'", file);
  const json ref = json::parse(in);
  const json& train = ref["train"];

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& world_comm = *pg.host;
  if (world_comm.size() % tp != 0) {
    ZERO_THROW(InvalidArgument, "--tp {} does not divide the {} ranks", tp, world_comm.size());
  }
  comm::Mesh mesh(world_comm, {.pp = 1, .dp = world_comm.size() / tp, .tp = tp});
  comm::Communicator& comm = mesh.dp();
  const int rank = comm.rank(), world = comm.size();
  const int ref_world = train["world_size"].get<int>();
  if (ref_world % world != 0) ZERO_THROW(InvalidArgument, "reference world size {} is not a multiple of {}", ref_world, world);
  const int micro = ref_world / world;

  const examples::Gpt full_model = examples::reference_model(ref);
  const examples::GptParallel parallel{tp > 1 ? &mesh.tp() : nullptr, sequence_parallel};
  if (sequence_parallel && tp == 1) {
    ZERO_THROW(InvalidArgument, "--sequence-parallel needs --tp above 1 (it splits the sequence over the tp ranks)");
  }
  examples::Gpt model = tp > 1 ? examples::Gpt(full_model, parallel) : full_model;
  // PyTorch's tensor `name` as this rank holds it (its tp part; the vocabulary padded with zeros).
  auto part_of = [&](size_t i, std::vector<float> whole) {
    const examples::Gpt::Param& p = model.params()[i];
    if (tp == 1) return whole;
    std::vector<int64_t> shape = full_model.params()[i].shape;
    if (p.name == "wte.weight") {
      shape[0] = model.vocab_range().padded;
      whole.resize(static_cast<size_t>(shape[0] * shape[1]), 0.0f);
    }
    std::vector<float> part(p.values.size());
    shard(whole.data(), shape, p.tp, mesh.tp().rank(), tp, part.data());
    return part;
  };
  // The reference's groups: decayed tensors first.
  for (const json& g : train["param_groups"]) {
    const bool decay = g["weight_decay"].get<float>() > 0;
    for (const auto& n : g["names"]) {
      for (auto& p : model.params()) {
        if (p.name == n.get<std::string>()) p.decay = decay;
      }
    }
  }
  // "check": the model alone, gradients into plain buffers (summed over tp where they are partial).
  {
    examples::Gpt alone = model;
    const examples::TokenBatch batch = examples::split_rows(ref["check"]["tokens"]);
    std::vector<std::vector<float>> grads;
    for (const auto& p : alone.params()) grads.emplace_back(p.values.size(), 0.0f);
    examples::Gpt::Access access;
    access.grad = [&](size_t i) { return grads[i].data(); };
    const float loss = alone.forward(batch.inputs, batch.targets, batch.B, batch.T, access);
    const double want_loss = ref["check"]["loss"].get<double>();
    ZERO_CHECK(std::fabs(loss - want_loss) <= 1e-6 * std::fabs(want_loss), "check: loss {} but PyTorch {}", loss,
               want_loss);
    alone.backward(1.0f, access);
    for (size_t i = 0; i < grads.size(); ++i) {
      const examples::Gpt::Param& p = alone.params()[i];
      if (p.tp.partial_grad) {
        mesh.tp().all_reduce(grads[i].data(), grads[i].size(), DType::kFloat32, comm::ReduceOp::kSum)->wait();
      }
      const std::vector<float> want = part_of(i, ref["check"]["grads"][p.name].get<std::vector<float>>());
      double worst = 0, largest = 0;
      for (const float w : ref["check"]["grads"][p.name].get<std::vector<float>>()) {
        largest = std::max(largest, std::fabs(static_cast<double>(w)));
      }
      for (size_t e = 0; e < want.size(); ++e) worst = std::max(worst, std::fabs(static_cast<double>(want[e]) - grads[i][e]));
      ZERO_CHECK(worst <= 1e-5 * largest, "check: gradient of {} differs by {} (largest {})", p.name, worst, largest);
    }
  }

  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.kind = optim::OptimizerKind::kAdamW;
  const float lr = train["lr"].get<float>();
  const auto betas = train["betas"].get<std::vector<float>>();
  const float eps = train["eps"].get<float>();
  opt.optimizer.groups.clear();
  for (const json& g : train["param_groups"]) {
    opt.optimizer.groups.push_back(optim::Hyper{.lr = lr, .weight_decay = g["weight_decay"].get<float>(),
                                                .beta1 = betas[0], .beta2 = betas[1], .eps = eps});
  }
  ZERO_CHECK(train["param_groups"][0]["weight_decay"].get<float>() > 0, "group 0 is the decayed one");
  opt.max_grad_norm = train["max_grad_norm"].get<float>();
  opt.gradient_accumulation_steps = micro;
  opt.offload.optimizer = offload;
  opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 16};
  Engine engine(EngineComms{.shard = &comm, .tp = tp > 1 ? &mesh.tp() : nullptr,
                            .model_parallel = tp > 1 ? &mesh.model_parallel() : nullptr},
                opt);
  examples::GptScopes scopes(engine, model);
  const std::vector<int>& ids = scopes.ids();
  engine.finalize();
  const examples::Gpt::Access access = scopes.access();

  double worst_loss = 0, worst_param = 0;
  const int steps = train["steps"].get<int>();
  for (int s = 0; s < steps; ++s) {
    for (int m = 0; m < micro; ++m) {
      const int r = rank * micro + m;
      const examples::TokenBatch batch = examples::split_rows(train["tokens_per_step_per_rank"][s][r]);
      const float loss = model.forward(batch.inputs, batch.targets, batch.B, batch.T, access);
      const double want = train["loss_per_step_per_rank"][s][r].get<double>();
      worst_loss = std::max(worst_loss, std::fabs(loss - want) / std::fabs(want));
      model.backward(1.0f, access);
      engine.finish_backward();
    }
    const StepResult res = engine.step();
    const double norm = train["grad_norm_before_clip"][s].get<double>();
    ZERO_CHECK(std::fabs(res.grad_norm - norm) <= 1e-5 * norm, "step {}: grad norm {} but PyTorch {}", s + 1,
               res.grad_norm, norm);
    // The parameters after the step, through each unit's scope (the engine owns them at stage 3).
    for (int u = 0; u < model.num_units(); ++u) {
      UnitScope scope = engine.gather(u);
      for (size_t i = 0; i < model.params().size(); ++i) {
        if (model.params()[i].unit != u) continue;
        const float* got = scope.param_as<float>(ids[i]);
        const auto want = part_of(i, train["params_after_step"][s][model.params()[i].name].get<std::vector<float>>());
        for (size_t e = 0; e < want.size(); ++e) {
          worst_param = std::max(worst_param, std::fabs(static_cast<double>(got[e]) - want[e]));
        }
        if (model.params()[i].name == "wte.weight") {  // the vocabulary's padding rows: exactly zero
          const size_t C = static_cast<size_t>(model.config().n_embd);
          for (size_t e = static_cast<size_t>(model.vocab_range().real_rows()) * C; e < want.size(); ++e) {
            ZERO_CHECK(got[e] == 0.0f, "step {}: a padding row of the vocabulary holds {}", s + 1, got[e]);
          }
        }
      }
    }
  }
  ZERO_CHECK(worst_loss <= 1e-5, "rank {}: a loss differs from PyTorch's by {} (relative)", rank, worst_loss);
  ZERO_CHECK(worst_param <= 2e-4, "rank {}: a parameter differs from PyTorch's by {}", rank, worst_param);
  std::printf("rank %d: check and %d steps match PyTorch (loss %.2e relative, parameters %.2e absolute; dp %d x tp %d%s)\n",
              world_comm.rank(), steps, worst_loss, worst_param, world, tp, sequence_parallel ? ", sequence parallel" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::examples::run_program("gpt_reference_worker", run, argc, argv); }
