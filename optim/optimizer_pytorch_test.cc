// The optimizers against PyTorch 1.13's results (tests/data/pytorch/optim/*.json): every file, every
// step, relative error at most 1e-6 per element, on every SIMD path this CPU supports, with 1 and 3
// threads, on a shard that is the parameter alone and on a shard that splits it into segments of odd
// lengths (333 and 667 elements, not multiples of any vector width) around padding that must stay
// untouched. fp32 results must also be bitwise equal across paths, thread counts and layouts.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/dtype.h"
#include "optim/optimizer.h"
#include "testing/testdata.h"

namespace zero::optim {
namespace {

using nlohmann::json;

struct Reference {
  std::string name;
  OptimizerKind kind;
  Hyper hyper;
  size_t numel = 0;
  std::vector<float> initial;
  std::vector<std::vector<float>> grads, expected;
};

std::vector<float> to_floats(const json& j) {
  std::vector<float> v;
  v.reserve(j.size());
  for (const json& x : j) v.push_back(static_cast<float>(x.get<double>()));
  return v;
}

Reference load(const std::string& file) {
  std::ifstream in(testing::testdata_path("optim/" + file));
  const json d = json::parse(in);
  Reference r;
  r.name = file;
  const std::string opt = d.at("optimizer");
  const json& hp = d.at("hyperparameters");
  Hyper& h = r.hyper;
  h.lr = hp.at("lr").get<float>();
  h.weight_decay = hp.value("weight_decay", 0.0f);
  if (opt == "AdamW" || opt == "Adam") {
    r.kind = opt == "AdamW" ? OptimizerKind::kAdamW : OptimizerKind::kAdam;
    h.beta1 = hp.at("betas")[0].get<float>();
    h.beta2 = hp.at("betas")[1].get<float>();
    h.eps = hp.at("eps").get<float>();
    REQUIRE_FALSE(hp.value("amsgrad", false));
  } else if (opt == "SGD") {
    r.kind = OptimizerKind::kSgd;
    h.momentum = hp.at("momentum").get<float>();
    h.dampening = hp.at("dampening").get<float>();
    h.nesterov = hp.at("nesterov").get<bool>();
  } else if (opt == "Adagrad") {
    r.kind = OptimizerKind::kAdagrad;
    h.eps = hp.at("eps").get<float>();
    h.lr_decay = hp.at("lr_decay").get<float>();
    h.initial_accumulator_value = hp.at("initial_accumulator_value").get<float>();
  } else {
    FAIL("unexpected optimizer " << opt << " in " << file);
  }
  REQUIRE_FALSE(hp.value("maximize", false));
  r.numel = d.at("numel").get<size_t>();
  r.initial = to_floats(d.at("initial_params"));
  for (const json& g : d.at("grads")) r.grads.push_back(to_floats(g));
  for (const json& p : d.at("params_after_step")) r.expected.push_back(to_floats(p));
  REQUIRE(r.initial.size() == r.numel);
  REQUIRE(r.grads.size() == d.at("steps").get<size_t>());
  REQUIRE(r.expected.size() == r.grads.size());
  return r;
}

const char* kFiles[] = {"adamw_basic.json", "adam_l2.json", "sgd_nesterov.json", "adagrad.json"};

// Where parameter element k lives in the shard.
struct Layout {
  size_t shard_numel;
  std::vector<Segment> segments;
  std::vector<size_t> index;  // shard index of each parameter element
};

Layout whole(size_t n) {
  Layout l{n, {Segment{0, n, 0, "w", 0}}, {}};
  for (size_t k = 0; k < n; ++k) l.index.push_back(k);
  return l;
}

// 5 padding elements, param[0, 333), 3 padding, param[333, n), 13 padding; plus a padding segment
// (empty name) over the middle gap.
Layout split(size_t n) {
  const size_t a = 333;
  Layout l;
  l.shard_numel = 5 + a + 3 + (n - a) + 13;
  l.segments = {Segment{5, 5 + a, 0, "w", 0}, Segment{5 + a, 8 + a, 0, "", 0},
                Segment{8 + a, 8 + n, 0, "w", a}};
  for (size_t k = 0; k < n; ++k) l.index.push_back(k < a ? 5 + k : 8 + k);
  return l;
}

constexpr float kPadMaster = -7.25f;
constexpr uint16_t kPadOut = 0xabcd;

struct Run {
  std::vector<std::vector<float>> params;  // parameter after each step
  double max_rel_error = 0;
  size_t bitwise_equal = 0, total = 0;  // elements bitwise equal to PyTorch's, of all compared
};

// Runs all steps; checks padding is untouched and the bf16 copy-out equals RNE(master).
Run run(const Reference& r, const Layout& l, SimdPath path, int threads) {
  OptimizerOptions o;
  o.kind = r.kind;
  o.groups = {r.hyper};
  o.num_threads = threads;
  o.simd_path = path;
  Optimizer opt(o, l.shard_numel, l.segments);
  std::vector<float> master(l.shard_numel, kPadMaster);
  std::vector<float> grad(l.shard_numel, std::numeric_limits<float>::quiet_NaN());
  std::vector<uint16_t> out(l.shard_numel, kPadOut);
  for (size_t k = 0; k < r.numel; ++k) master[l.index[k]] = r.initial[k];
  Run result;
  for (size_t s = 0; s < r.grads.size(); ++s) {
    for (size_t k = 0; k < r.numel; ++k) grad[l.index[k]] = r.grads[s][k];
    StepInput in;
    in.master = master.data();
    in.grad = grad.data();
    in.model_out = out.data();
    in.model_dtype = DType::kBFloat16;
    opt.step(in);
    std::vector<float> p(r.numel);
    for (size_t k = 0; k < r.numel; ++k) {
      p[k] = master[l.index[k]];
      const double ref = r.expected[s][k];
      const double err = std::fabs(p[k] - ref) / std::fabs(ref);
      result.max_rel_error = std::max(result.max_rel_error, err);
      result.bitwise_equal += (p[k] == r.expected[s][k]);
      ++result.total;
      if (!(err <= 1e-6)) {
        FAIL(fmt::format("{} step {} element {}: got {:.9g}, PyTorch {:.9g} (relative error {:.3g}), "
                         "path {}, {} threads",
                         r.name, s + 1, k, p[k], ref, err, simd_path_name(path), threads));
      }
      if (out[l.index[k]] != fp32_to_bf16_bits(p[k])) {
        FAIL(fmt::format("{} step {} element {}: bf16 copy-out {:#06x} != RNE(master {:.9g}) {:#06x}",
                         r.name, s + 1, k, out[l.index[k]], p[k], fp32_to_bf16_bits(p[k])));
      }
    }
    result.params.push_back(std::move(p));
  }
  // Padding: never touched.
  std::vector<bool> is_param(l.shard_numel, false);
  for (size_t i : l.index) is_param[i] = true;
  for (size_t i = 0; i < l.shard_numel; ++i) {
    if (is_param[i]) continue;
    CHECK(master[i] == kPadMaster);
    CHECK(out[i] == kPadOut);
    for (const std::string& name : opt.state_names()) {
      const float* st = static_cast<const float*>(opt.state_data(name));
      CHECK(st[i] == 0.0f);
    }
  }
  CHECK(opt.step_count() == static_cast<int64_t>(r.grads.size()));
  return result;
}

TEST_CASE("every PyTorch reference file, every SIMD path, 1 and 3 threads, two layouts") {
  for (const char* file : kFiles) {
    const Reference r = load(file);
    std::vector<std::vector<float>> baseline;  // scalar, 1 thread, whole layout
    for (SimdPath path : supported_simd_paths()) {
      for (int threads : {1, 3}) {
        for (int split_layout : {0, 1}) {
          CAPTURE(file);
          CAPTURE(simd_path_name(path));
          CAPTURE(threads);
          CAPTURE(split_layout);
          const Layout l = split_layout ? split(r.numel) : whole(r.numel);
          const Run result = run(r, l, path, threads);
          MESSAGE(fmt::format("{} {} threads={} layout={}: max relative error {:.3g}, {}/{} elements "
                              "bitwise equal to PyTorch",
                              file, simd_path_name(path), threads, split_layout ? "split" : "whole",
                              result.max_rel_error, result.bitwise_equal, result.total));
          // Stronger than the 1e-6 requirement: the fused multiply-adds are PyTorch's, so every
          // element matches exactly.
          CHECK(result.bitwise_equal == result.total);
          if (baseline.empty()) {
            baseline = result.params;
            continue;
          }
          for (size_t s = 0; s < baseline.size(); ++s) {
            REQUIRE(std::memcmp(baseline[s].data(), result.params[s].data(),
                                baseline[s].size() * sizeof(float)) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("reference files reproduced from every prefix length 1..40 (vector tails)") {
  // Short shards exercise the vector/tail split of every path: any length must give the same bits.
  for (const char* file : kFiles) {
    const Reference r = load(file);
    for (size_t n = 1; n <= 40; ++n) {
      std::vector<std::vector<float>> baseline;
      for (SimdPath path : supported_simd_paths()) {
        OptimizerOptions o;
        o.kind = r.kind;
        o.groups = {r.hyper};
        o.simd_path = path;
        Optimizer opt(o, n, {Segment{0, n, 0, "w", 0}});
        std::vector<float> master(r.initial.begin(), r.initial.begin() + static_cast<long>(n));
        std::vector<std::vector<float>> params;
        for (size_t s = 0; s < r.grads.size(); ++s) {
          StepInput in;
          in.master = master.data();
          in.grad = r.grads[s].data();
          opt.step(in);
          for (size_t k = 0; k < n; ++k) {
            const double ref = r.expected[s][k];
            REQUIRE(std::fabs(master[k] - ref) <= 1e-6 * std::fabs(ref));
          }
          params.push_back(master);
        }
        if (baseline.empty()) {
          baseline = params;
        } else {
          CAPTURE(file);
          CAPTURE(n);
          CAPTURE(simd_path_name(path));
          REQUIRE(params == baseline);
        }
      }
    }
  }
}

}  // namespace
}  // namespace zero::optim
