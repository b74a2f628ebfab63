// The GPT example's model against a PyTorch reference file (tests/data/pytorch/gpt format): "check",
// one forward and backward at the initial parameters (the loss within 1e-6 relative, every gradient
// tensor within 1e-5 x its largest magnitude), then "train", the data-parallel run through the
// engine (per-rank losses within 1e-5 relative, the gradient norm, every parameter within 2e-4
// absolute after every step), at any stage. Run under zerorun with the file's world size, or a
// divisor of it (micro-steps make up the rest), times --tp: the ranks form a (dp, tp) mesh, each
// holding its tensor-parallel part of the model (--sequence-parallel: the residual stream split
// along the sequence too), compared with the same part of PyTorch's tensors (the padding rows of a
// vocabulary tp does not divide must stay zero). With --pp P the ranks form a (pp, dp, tp) mesh and
// the model is split into pipeline stages run by a schedule (--pp-schedule gpipe|1f1b|interleaved|
// zb-h1|zb-v, --chunks V for interleaved, --pp-layers for uneven stages): each reference rank's batch is
// one or more micro-batches (--micro-batches M per data-parallel rank: its reference batches split
// into equal row groups), each reference rank's loss the mean of its parts'; --reduce-each-micro-batch
// reduces every micro-batch's gradients into the shard (stages 2 and 3); --mesh-order lays the mesh
// out in another order (default pp,dp,tp). --print-digest prints
// a hash of every loss, norm and parameter bit, for bitwise comparisons across schedules. Prints
// whether it matches; any file of the format works, so a new reference needs no new code. A file's
// param_groups may name their optimizer and its settings (scripts/gpt_optimizer_reference.py: Muon
// with AdamW, Adafactor with AdamW); each group takes the names the file lists (as name patterns,
// optimizer.groups[].params), whatever group the example would register them in.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "comm/mesh.h"
#include "tools/cli/flags.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/gpt_pipeline.h"
#include "examples/gpt/gpt_reference.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/schedules.h"
#include "testing/reference_groups.h"
#include "zero/engine.h"
#include "zero/tp_placement.h"

namespace {

using namespace zero;
using json = nlohmann::json;

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const std::string file = flags.get("file", "");
  const int stage = flags.get_int("stage", 2);
  const bool offload = flags.get_bool("offload", false);
  const int tp = flags.get_int("tp", 1);
  const bool sequence_parallel = flags.get_bool("sequence-parallel", false);
  const int pp = flags.get_int("pp", 1);
  const int micro_batches_flag = flags.get_int("micro-batches", 0);
  const std::string pp_schedule = flags.get("pp-schedule", "1f1b");
  const int chunks = flags.get_int("chunks", pp_schedule == "zb-v" ? 2 : 1);  // zb-v's V holds 2
  const std::vector<int> pp_layers = examples::parse_layer_counts(flags.get("pp-layers", ""));
  const bool print_digest = flags.get_bool("print-digest", false);
  const bool reduce_each = flags.get_bool("reduce-each-micro-batch", false);
  const std::string mesh_order = flags.get("mesh-order", "pp,dp,tp");  // slowest-varying first
  flags.check_all_used();
  if (tp < 1) ZERO_THROW(InvalidArgument, "--tp {} is not positive", tp);
  if (pp < 1) ZERO_THROW(InvalidArgument, "--pp {} is not positive", pp);
  std::ifstream in(file);
  if (!in) ZERO_THROW(IoError, "cannot open reference file '{}'", file);
  const json ref = json::parse(in);
  const json& train = ref["train"];

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& world_comm = *pg.host;
  if (world_comm.size() % (tp * pp) != 0) {
    ZERO_THROW(InvalidArgument, "--tp {} x --pp {} does not divide the {} ranks", tp, pp, world_comm.size());
  }
  comm::Mesh mesh(world_comm, comm::MeshShape{.pp = pp, .dp = world_comm.size() / (tp * pp), .tp = tp, .order = comm::parse_mesh_order(mesh_order)});
  comm::Communicator& comm = mesh.dp();
  const int rank = comm.rank(), world = comm.size();
  const int ref_world = train["world_size"].get<int>();
  if (ref_world % world != 0) ZERO_THROW(InvalidArgument, "reference world size {} is not a multiple of {}", ref_world, world);
  const int micro = ref_world / world;

  examples::Gpt full_model = examples::reference_model(ref);
  const examples::GptParallel parallel{tp > 1 ? &mesh.tp() : nullptr, sequence_parallel};
  if (sequence_parallel && tp == 1) {
    ZERO_THROW(InvalidArgument, "--sequence-parallel needs --tp above 1 (it splits the sequence over the tp ranks)");
  }
  examples::Gpt model = tp > 1 ? examples::Gpt(full_model, parallel) : full_model;
  auto ref_shape = [&](const std::string& name) {
    for (const auto& q : full_model.params()) {
      if (q.name == name) return q.shape;
    }
    ZERO_THROW(InvalidArgument, "no parameter '{}' in the reference", name);
  };
  // PyTorch's tensor `name` as this rank holds it (its tp part; the vocabulary padded with zeros).
  auto part_of = [&](const examples::Gpt::Param& p, std::vector<float> whole) {
    if (tp == 1) return whole;
    std::vector<int64_t> shape = ref_shape(p.name);
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
      for (auto& p : full_model.params()) {
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
      const std::vector<float> want = part_of(p, ref["check"]["grads"][p.name].get<std::vector<float>>());
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
  opt.optimizer.groups.clear();
  // The file decides the grouping: each group takes its names (exact names are patterns).
  for (const json& g : train["param_groups"]) opt.optimizer.groups.push_back(testing::reference_group(g, train));
  ZERO_CHECK(train["param_groups"][0]["weight_decay"].get<float>() > 0, "group 0 is the decayed one");
  opt.max_grad_norm = train["max_grad_norm"].get<float>();
  opt.offload.optimizer = offload;
  opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 16};
  // A pipeline's micro-batches: each reference batch of this dp rank split into `parts` row groups.
  const int micro_batches = micro_batches_flag > 0 ? micro_batches_flag : micro;
  if (micro_batches % micro != 0) {
    ZERO_THROW(InvalidArgument, "--micro-batches {} is not a multiple of the {} reference batches per data-parallel rank",
               micro_batches, micro);
  }
  const int parts = micro_batches / micro;
  if (pp == 1 && parts != 1) ZERO_THROW(InvalidArgument, "--micro-batches splits batches only under --pp above 1");
  opt.micro_batches = pp > 1 ? micro_batches : micro;
  if (reduce_each) opt.micro_batch_reduce = MicroBatchReduce::kEach;
  Engine engine(parallel::engine_comms(mesh), opt);
  std::unique_ptr<examples::GptScopes> scopes;
  std::unique_ptr<examples::GptPipeline> pipe;
  if (pp > 1) {
    // The micro-batches' shape (the reference's batches all have the first's), for the zero-bubble
    // schedules' memory bound.
    const examples::TokenBatch shape = examples::split_rows(train["tokens_per_step_per_rank"][0][0]);
    pipe = std::make_unique<examples::GptPipeline>(
        full_model, parallel, mesh,
        examples::gpt_schedule(pp_schedule, full_model.config(), pp, micro_batches, chunks, pp_layers, tp,
                               sequence_parallel, shape.B / parts, shape.T, false),
        pp_layers, engine);
  } else {
    scopes = std::make_unique<examples::GptScopes>(engine, model);
  }
  pipe ? pipe->finalize() : engine.finalize();
  // Every (model, its engine ids) this rank holds: the whole tp part, or its pipeline chunks.
  std::vector<std::pair<examples::Gpt*, const std::vector<int>*>> held;
  if (pipe) {
    for (size_t c = 0; c < pipe->chunks().size(); ++c) held.emplace_back(&pipe->chunks()[c], &pipe->ids(static_cast<int>(c)));
  } else {
    held.emplace_back(&model, &scopes->ids());
  }

  double worst_loss = 0, worst_param = 0;
  // FNV-1a over every loss and norm bit, and per parameter over its final values' bits.
  auto fnv = [](uint64_t h, const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
    return h;
  };
  constexpr uint64_t kFnvBasis = 1469598103934665603ull;
  uint64_t digest = kFnvBasis;
  auto mix = [&](const void* p, size_t n) { digest = fnv(digest, p, n); };
  std::map<std::string, uint64_t> param_digest;
  const int steps = train["steps"].get<int>();
  for (int s = 0; s < steps; ++s) {
    if (pipe) {
      std::vector<examples::MicroBatch> mbs;
      for (int m = 0; m < micro; ++m) {
        const examples::TokenBatch batch = examples::split_rows(train["tokens_per_step_per_rank"][s][rank * micro + m]);
        if (batch.B % parts != 0) ZERO_THROW(InvalidArgument, "--micro-batches: {} rows do not split into {}", batch.B, parts);
        const int rows = batch.B / parts;
        for (int q = 0; q < parts; ++q) {
          const auto from = static_cast<std::ptrdiff_t>(q * rows * batch.T), to = from + rows * batch.T;
          mbs.push_back({{batch.inputs.begin() + from, batch.inputs.begin() + to},
                         {batch.targets.begin() + from, batch.targets.begin() + to}, rows, batch.T});
        }
      }
      const examples::GptPipeline::StepResult r = pipe->train_step(mbs, engine.loss_scale());
      mix(r.losses.data(), r.losses.size() * sizeof(float));
      for (int m = 0; m < micro; ++m) {
        double mean = 0;
        for (int q = 0; q < parts; ++q) mean += r.losses[static_cast<size_t>(m * parts + q)];
        mean /= parts;
        const double want = train["loss_per_step_per_rank"][s][rank * micro + m].get<double>();
        worst_loss = std::max(worst_loss, std::fabs(mean - want) / std::fabs(want));
      }
    } else {
      const examples::Gpt::Access access = scopes->access();
      for (int m = 0; m < micro; ++m) {
        const int r = rank * micro + m;
        const examples::TokenBatch batch = examples::split_rows(train["tokens_per_step_per_rank"][s][r]);
        const float loss = model.forward(batch.inputs, batch.targets, batch.B, batch.T, access);
        mix(&loss, sizeof loss);
        const double want = train["loss_per_step_per_rank"][s][r].get<double>();
        worst_loss = std::max(worst_loss, std::fabs(loss - want) / std::fabs(want));
        model.backward(1.0f, access);
        engine.finish_backward();
      }
    }
    const StepResult res = engine.step();
    mix(&res.grad_norm, sizeof res.grad_norm);
    const double norm = train["grad_norm_before_clip"][s].get<double>();
    ZERO_CHECK(std::fabs(res.grad_norm - norm) <= 1e-5 * norm, "step {}: grad norm {} but PyTorch {}", s + 1,
               res.grad_norm, norm);
    // The parameters after the step, through each unit's scope (the engine owns them at stage 3).
    for (auto& [m, ids] : held) {
      for (int u : m->units()) {
        UnitScope scope = engine.gather(u);
        for (size_t i = 0; i < m->params().size(); ++i) {
          const examples::Gpt::Param& p = m->params()[i];
          if (p.unit != u) continue;
          const float* got = scope.param_as<float>((*ids)[i]);
          param_digest[p.name] = fnv(kFnvBasis, got, p.values.size() * sizeof(float));
          const auto want = part_of(p, train["params_after_step"][s][p.name].get<std::vector<float>>());
          for (size_t e = 0; e < want.size(); ++e) {
            worst_param = std::max(worst_param, std::fabs(static_cast<double>(got[e]) - want[e]));
          }
          if (p.name == "wte.weight") {  // the vocabulary's padding rows: exactly zero
            const size_t C = static_cast<size_t>(m->config().n_embd);
            for (size_t e = static_cast<size_t>(m->vocab_range().real_rows()) * C; e < want.size(); ++e) {
              ZERO_CHECK(got[e] == 0.0f, "step {}: a padding row of the vocabulary holds {}", s + 1, got[e]);
            }
          }
        }
      }
    }
  }
  ZERO_CHECK(worst_loss <= 1e-5, "rank {}: a loss differs from PyTorch's by {} (relative)", rank, worst_loss);
  ZERO_CHECK(worst_param <= 2e-4, "rank {}: a parameter differs from PyTorch's by {}", rank, worst_param);
  std::printf("rank %d: check and %d steps match PyTorch (loss %.2e relative, parameters %.2e absolute; dp %d x tp %d%s",
              world_comm.rank(), steps, worst_loss, worst_param, world, tp, sequence_parallel ? ", sequence parallel" : "");
  if (pipe) std::printf(" x pp %d, %s, %d micro-batches", pp, pipe->schedule().name.c_str(), micro_batches);
  std::printf(")\n");
  if (print_digest) {
    // Layout-independent: the losses and norms (every rank has them all), and each parameter this
    // rank holds (tp part named by its tp rank).
    std::printf("digest losses %016llx\n", static_cast<unsigned long long>(digest));
    for (const auto& [name, d] : param_digest) {
      std::printf("digest %s tp%d %016llx\n", name.c_str(), tp > 1 ? mesh.tp().rank() : 0, static_cast<unsigned long long>(d));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("gpt_reference_worker", run, argc, argv); }
