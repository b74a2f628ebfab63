// LAMB (examples/lamb.h), a rule that needs whole tensors, in the engine with whole-tensor ownership
// (ShardLayoutOptions.whole_tensors) at stages 0-3, on 1 and 2 ranks and offloaded, against the
// PyTorch reference of scripts/lamb_reference.py (examples/testdata/lamb_reference.json): after every
// step each tensor within 1e-6 relative (||ours - reference|| / ||reference||). Also: every rank
// updates whole tensors only, and the rule without the layout is refused, naming both.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "examples/lamb.h"
#include "testing/steps_reference.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

struct Reference : testing::StepsReference {
  int world = 0, steps = 0;
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0;
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;  // registration order
  std::map<std::string, float> weight_decay;
};

const Reference& reference() {
  static const Reference ref = [] {
    std::ifstream in("examples/testdata/lamb_reference.json");
    REQUIRE(in.good());
    const nlohmann::json j = nlohmann::json::parse(in);
    Reference r;
    static_cast<testing::StepsReference&>(r) = testing::steps_reference(j);
    r.world = j.at("world_size").get<int>();
    r.steps = j.at("steps").get<int>();
    r.lr = j.at("lr").get<float>();
    r.beta1 = j.at("betas").at(0).get<float>();
    r.beta2 = j.at("betas").at(1).get<float>();
    r.eps = j.at("eps").get<float>();
    for (const auto& p : j.at("params")) {
      r.params.emplace_back(p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>());
    }
    for (const auto& [name, wd] : j.at("weight_decay").items()) r.weight_decay[name] = wd.get<float>();
    return r;
  }();
  return ref;
}

// The reference's tensors in four units (the embedding alone, two layers, the small ones together).
int unit_of(const std::string& name) { return testing::reference_unit_of(name); }

struct Run {
  int stage = 1;
  int world = 2;
  bool offload = false;
  bool whole_tensors = true;
};

// LAMB that records each update() call as "name@offset+numel".
class RecordingLamb final : public optim::CustomOptimizer {
 public:
  RecordingLamb(std::vector<std::string>* calls, std::mutex* mu) : calls_(calls), mu_(mu) {}
  std::string name() const override { return inner_.name(); }
  std::vector<std::string> state_names() const override { return inner_.state_names(); }
  bool needs_whole_tensors() const override { return true; }
  void validate(const optim::Hyper& h, int g) const override { inner_.validate(h, g); }
  void update(const optim::UpdateContext& context, const optim::OwnedRange& r) override {
    inner_.update(context, r);
    std::lock_guard<std::mutex> lock(*mu_);
    calls_->push_back(std::string(r.param) + "@" + std::to_string(r.param_offset) + "+" + std::to_string(r.numel));
  }

 private:
  examples::Lamb inner_;
  std::vector<std::string>* calls_;
  std::mutex* mu_;
};

// Trains on `comm` as the reference does and returns each step's largest relative error over the
// tensors.
std::vector<double> train(comm::Communicator& comm, const Run& run, std::shared_ptr<optim::CustomOptimizer> rule) {
  const Reference& ref = reference();
  EngineOptions opt;
  opt.stage = run.stage;
  opt.optimizer.custom = std::move(rule);
  // Group 0 decays, group 1 does not (the reference's weight_decay per tensor is one of the two).
  const optim::Hyper decayed{.lr = ref.lr, .weight_decay = 0.01f, .beta1 = ref.beta1, .beta2 = ref.beta2, .eps = ref.eps};
  optim::Hyper plain = decayed;
  plain.weight_decay = 0.0f;
  opt.optimizer.groups = {decayed, plain};
  opt.timeout = 30s;
  // Small buckets, so that below stage 3 the tensors fall into several of them.
  opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 16, .whole_tensors = run.whole_tensors};
  opt.offload.optimizer = run.offload;
  Engine engine(comm, opt);
  std::map<std::string, std::vector<float>> storage;
  std::map<std::string, int> ids;
  for (const auto& [name, shape] : ref.params) {
    storage[name] = ref.initial.at(name);
    const float wd = ref.weight_decay.at(name);
    REQUIRE((wd == 0.0f || wd == decayed.weight_decay));
    ids[name] = engine.add_param({.name = name, .shape = shape, .dtype = DType::kFloat32,
                                  .data = {storage[name].data(), storage[name].size()}, .unit = unit_of(name),
                                  .group = wd == 0.0f ? 1 : 0});
  }
  engine.finalize();
  std::vector<double> errors;
  for (int step = 0; step < ref.steps; ++step) {
    for (int unit = 3; unit >= 0; --unit) {
      UnitScope s = engine.gather_for_backward(unit);
      for (const auto& [name, shape] : ref.params) {
        if (unit_of(name) != unit) continue;
        float* g = s.grad_as<float>(ids[name]);
        const std::vector<float>& g0 = ref.grads[static_cast<size_t>(step)][0].at(name);
        const std::vector<float>& g1 = ref.grads[static_cast<size_t>(step)][1].at(name);
        for (size_t e = 0; e < g0.size(); ++e) {
          // Two ranks bring their own; one rank brings the pair's mean (what the reduction computes).
          g[e] = run.world == 2 ? (comm.rank() == 0 ? g0[e] : g1[e]) : (g0[e] + g1[e]) / 2.0f;
        }
      }
    }
    engine.step();
    double worst = 0.0;
    for (int unit = 0; unit < 4; ++unit) {
      UnitScope s = engine.gather(unit);
      for (const auto& [name, shape] : ref.params) {
        if (unit_of(name) != unit) continue;
        const float* p = s.param_as<float>(ids[name]);
        const std::vector<float>& want = ref.after[static_cast<size_t>(step)].at(name);
        double diff = 0.0, norm = 0.0;
        for (size_t e = 0; e < want.size(); ++e) {
          diff += (static_cast<double>(p[e]) - want[e]) * (static_cast<double>(p[e]) - want[e]);
          norm += static_cast<double>(want[e]) * want[e];
        }
        worst = std::max(worst, std::sqrt(diff) / std::sqrt(norm));
      }
    }
    errors.push_back(worst);
  }
  return errors;
}

TEST_CASE("LAMB with whole-tensor ownership matches PyTorch within 1e-6 per tensor at stages 0-3") {
  REQUIRE(reference().world == 2);
  for (const Run run : {Run{.stage = 0}, Run{.stage = 1}, Run{.stage = 2}, Run{.stage = 3}, Run{.stage = 1, .world = 1},
                        Run{.stage = 3, .world = 1}, Run{.stage = 2, .offload = true}}) {
    CAPTURE(run.stage);
    CAPTURE(run.world);
    CAPTURE(run.offload);
    std::vector<std::string> calls;
    std::mutex mu;
    std::vector<std::vector<double>> errors(static_cast<size_t>(run.world));
    testing::run_thread_ranks(run.world, [&](comm::Communicator& comm) {
      errors[static_cast<size_t>(comm.rank())] = train(comm, run, std::make_shared<RecordingLamb>(&calls, &mu));
    });
    for (const std::vector<double>& e : errors) {
      REQUIRE(e.size() == static_cast<size_t>(reference().steps));
      for (size_t step = 0; step < e.size(); ++step) {
        CAPTURE(step);
        CHECK(e[step] <= 1e-6);
      }
      MESSAGE("stage " << run.stage << ", " << run.world << " rank(s)" << std::string(run.offload ? ", offloaded" : "")
                       << ": largest relative error per tensor after the last step " << e.back());
    }
    // Every call held a whole tensor, and every tensor was updated once a step, on one rank.
    std::map<std::string, int> updates;
    for (const std::string& c : calls) ++updates[c];
    for (const auto& [name, shape] : reference().params) {
      size_t numel = 1;
      for (int64_t d : shape) numel *= static_cast<size_t>(d);
      const std::string whole = name + "@0+" + std::to_string(numel);
      // Stage 0 replicates the optimizer: every rank updates every tensor.
      CHECK(updates[whole] == reference().steps * (run.stage == 0 ? run.world : 1));
    }
    CHECK(updates.size() == reference().params.size());
  }
}

TEST_CASE("LAMB without whole-tensor ownership is refused, naming the rule and the option") {
  testing::run_thread_ranks(1, [](comm::Communicator& comm) {
    CHECK_THROWS_WITH_AS(train(comm, {.stage = 2, .world = 1, .whole_tensors = false}, std::make_shared<examples::Lamb>()),
                         "EngineOptions.optimizer.custom: 'lamb' needs whole tensors (a per-tensor rule), but the flat "
                         "ranges cut tensors across ranks and buckets: set EngineOptions.layout.whole_tensors (each "
                         "tensor owned by one rank; docs/optim.md)",
                         InvalidArgument);
  });
}

}  // namespace
}  // namespace zero
