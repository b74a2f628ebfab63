// One rank of the PyTorch-reference check for the engine (driven by zero_reference_test).
//
// Reads a tests/data/pytorch/zero/*.json file, trains its model at the given stage on the ranks the
// launcher started, and compares the parameters after every step with PyTorch's. With fewer ranks
// than the reference, each rank accumulates world_size / N micro-batches: rank r's micro-step m uses
// the reference gradient of rank r * K + m. Exits non-zero on any mismatch; with --dump it writes
// rank 0's final parameters (raw fp32) so runs can be compared bit for bit.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "tools/cli/flags.h"
#include "zero/engine.h"

namespace {

using json = nlohmann::json;

int run(int argc, char** argv) {
  using namespace zero;
  cli::Flags flags(argc, argv);
  const std::string file = flags.get("file", "");
  const int stage = flags.get_int("stage", 2);
  const bool deterministic = flags.get_bool("deterministic", false);
  const bool no_sync = flags.get_bool("no-sync", false);
  const bool use_grad_ready = flags.get_bool("grad-ready", true);
  // The loop with unit scopes (one unit per parameter, backward scopes in reverse), and no_sync()
  // scopes around every micro-step but the last.
  const bool units = flags.get_bool("units", false);
  const bool no_sync_scope = flags.get_bool("no-sync-scope", false);
  const bool offload = flags.get_bool("offload", false);
  const bool offload_params = flags.get_bool("offload-params", false);
  if (stage == 3 && !units) ZERO_THROW(InvalidArgument, "--stage 3 reads the parameters through unit scopes: add --units");
  const int bucket = flags.get_int("bucket-numel", 512);
  const std::string dump = flags.get("dump", "");
  const double tolerance = flags.get_double("tolerance", 1e-5);
  flags.check_all_used();

  std::ifstream in(file);
  if (!in) ZERO_THROW(IoError, "cannot open reference file '{}'", file);
  const json ref = json::parse(in);

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& comm = *pg.host;
  const int rank = comm.rank(), world = comm.size();
  const int ref_world = ref["world_size"].get<int>();
  if (ref_world % world != 0) {
    ZERO_THROW(InvalidArgument, "reference world size {} is not a multiple of {}", ref_world, world);
  }
  const int micro = ref_world / world;

  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.kind = optim::OptimizerKind::kAdamW;
  std::map<std::string, int> group_of;
  opt.optimizer.groups.clear();
  for (const auto& g : ref["param_groups"]) {
    optim::Hyper h;
    h.lr = ref["lr"].get<float>();
    h.beta1 = ref["betas"][0].get<float>();
    h.beta2 = ref["betas"][1].get<float>();
    h.eps = ref["eps"].get<float>();
    h.weight_decay = g["weight_decay"].get<float>();
    for (const auto& n : g["names"]) group_of[n.get<std::string>()] = static_cast<int>(opt.optimizer.groups.size());
    opt.optimizer.groups.push_back(h);
  }
  opt.max_grad_norm = ref["max_grad_norm"].get<float>();
  opt.micro_batches = micro;
  opt.micro_batch_reduce = no_sync ? MicroBatchReduce::kOnce : MicroBatchReduce::kEach;
  opt.deterministic = deterministic;
  opt.offload.optimizer = offload;
  opt.offload.params = offload_params;
  // Small buckets and blocks so that the tiny model spans several buckets and tensors split.
  opt.layout = {.alignment = 4, .bucket_numel = static_cast<size_t>(bucket), .block = 16};
  Engine engine(comm, opt);

  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  for (const auto& p : ref["params"]) names.push_back(p["name"].get<std::string>());
  values.resize(names.size());
  std::vector<int> ids;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& p = ref["params"][i];
    values[i] = ref["initial_params"][names[i]].get<std::vector<float>>();
    // Ranks other than 0 start from garbage: finalize() must broadcast rank 0's values.
    if (rank != 0) std::fill(values[i].begin(), values[i].end(), 1e3f);
    ids.push_back(engine.add_param({.name = names[i], .shape = p["shape"].get<std::vector<int64_t>>(),
                                    .dtype = DType::kFloat32,
                                    .data = {values[i].data(), values[i].size()},
                                    .unit = static_cast<int>(i), .group = group_of.at(names[i])}));
  }
  engine.finalize();

  const int steps = ref["steps"].get<int>();
  double worst = 0.0;
  std::vector<std::vector<float>> last;  // the parameters after the last step (for --dump)
  for (int s = 0; s < steps; ++s) {
    for (int m = 0; m < micro; ++m) {
      const auto& grads = ref["grads_per_step_per_rank"][s][rank * micro + m];
      std::optional<NoSyncScope> quiet;
      if (no_sync_scope && m + 1 < micro) quiet.emplace(engine.no_sync());
      // Reverse order, as a backward pass would produce them.
      for (size_t i = names.size(); i-- > 0;) {
        const std::vector<float> g = grads[names[i]].get<std::vector<float>>();
        if (units) {
          UnitScope scope = engine.gather_for_backward(static_cast<int>(i));
          float* dst = scope.grad_as<float>(ids[i]);
          for (size_t k = 0; k < g.size(); ++k) dst[k] += g[k];
          continue;
        }
        float* dst = engine.grad_as<float>(ids[i]);
        for (size_t k = 0; k < g.size(); ++k) dst[k] += g[k];
        if (use_grad_ready) engine.grad_ready(ids[i]);
      }
      engine.finish_backward();
    }
    const StepResult r = engine.step();
    const double ref_norm = ref["grad_norm_before_clip"][s].get<double>();
    if (std::fabs(r.grad_norm - ref_norm) > tolerance * ref_norm) {
      ZERO_THROW(Error, "rank {} step {}: grad norm {} but PyTorch {}", rank, s + 1, r.grad_norm, ref_norm);
    }
    // The parameters after the step: the user's storage, or (with units: required at stage 3, where
    // the engine owns them) read through each unit's gather scope.
    std::vector<std::vector<float>> current = values;
    if (units) {
      for (size_t i = 0; i < names.size(); ++i) {
        UnitScope scope = engine.gather(static_cast<int>(i));
        const float* p = scope.param_as<float>(ids[i]);
        current[i].assign(p, p + values[i].size());
      }
    }
    last = current;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::vector<float> want = ref["params_after_step"][s][names[i]].get<std::vector<float>>();
      for (size_t k = 0; k < want.size(); ++k) {
        const double err = std::fabs(static_cast<double>(current[i][k]) - want[k]) /
                           std::max(std::fabs(static_cast<double>(want[k])), 1e-3);
        worst = std::max(worst, err);
        if (err > tolerance) {
          ZERO_THROW(Error, "rank {} step {}: {}[{}] = {} but PyTorch has {} (relative error {:.3g})",
                     rank, s + 1, names[i], k, current[i][k], want[k], err);
        }
      }
    }
  }
  std::printf("rank %d: stage %d, %d rank(s) x %d micro-step(s)%s: %d steps match PyTorch, max relative error %.3g\n",
              rank, stage, world, micro, deterministic ? ", deterministic" : "", steps, worst);
  if (!dump.empty() && rank == 0) {
    std::ofstream out(dump, std::ios::binary);
    for (const auto& v : last) out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    if (!out) ZERO_THROW(IoError, "cannot write '{}'", dump);
  }
  comm.barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("zero_reference_worker", run, argc, argv); }
