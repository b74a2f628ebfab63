// Parameters of two dtypes in one model: bf16 matrices beside fp32 biases and LayerNorm weights, in
// the same units and registered interleaved. The layout gives each dtype buckets of its own (a unit
// of both is two buckets, its tensors ordered by dtype); the deterministic training is the same bits
// at stages 0-3, offloaded too; stage 3 gathers each dtype in its own collective; a checkpoint saved
// at stage 3 resumes at stage 1 bit for bit; fp32 parameters keep fp32 values; the same model
// registered all fp32 with a bf16 EngineOptions.param_dtype and ParamSpec.param_dtype fp32 on the
// biases and norms (FSDP2's per-module policy) trains the same bits at stage 3; and what a mix cannot
// take is refused, naming the field.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/float16.h"
#include "testing/sync_counting.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

struct Tensor {
  std::string name;
  size_t numel;
  DType dtype;
  int unit;
};
// Unit 0 registers its dtypes interleaved; unit 2 is fp32 only.
const std::vector<Tensor> kModel = {
    {"u0.w", 384, DType::kBFloat16, 0}, {"u0.b", 16, DType::kFloat32, 0},  {"u0.w2", 200, DType::kBFloat16, 0},
    {"u0.ln", 30, DType::kFloat32, 0},  {"u1.w", 500, DType::kBFloat16, 1}, {"u1.b", 20, DType::kFloat32, 1},
    {"u2.ln", 40, DType::kFloat32, 2},
};
constexpr int kUnits = 3;
constexpr int kSteps = 4;

// bf16 tensors start from values bf16 holds exactly, so that registering them in fp32 (with a bf16
// param_dtype) starts the same master.
float initial(size_t t, size_t e) {
  const float v = std::cos(0.1f * static_cast<float>(e) + static_cast<float>(t));
  return kModel[t].dtype == DType::kBFloat16 ? bf16_bits_to_fp32(fp32_to_bf16_bits(v)) : v;
}

struct Run {
  int stage = 0;
  bool offload = false;
  // Every parameter registered fp32: EngineOptions.param_dtype bf16, ParamSpec.param_dtype fp32 on the
  // fp32 tensors of kModel (stage 3).
  bool fp32_storage = false;
  int first_step = 0, last_step = kSteps;  // steps [first, last)
  std::string load_dir, save_dir;          // load before the first step, save after the last
};

struct Result {
  std::vector<std::vector<uint32_t>> reads;  // every parameter read in a scope, as its bits
  std::vector<std::vector<uint32_t>> final;  // the parameters after the last step
  std::map<DType, int64_t> gather_bytes;     // parameter all-gathers over the steps, per dtype
};

EngineOptions options_for(const Run& run) {
  EngineOptions opt;
  opt.stage = run.stage;
  opt.optimizer.kind = optim::OptimizerKind::kAdamW;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
  opt.max_grad_norm = 1.0f;
  opt.deterministic = true;
  // Reduced bf16 gradients stay bf16 and fp32 ones fp32 at every stage (stages 0 and 1 keep them in
  // the parameters' dtypes), so the stages agree bit for bit.
  opt.grad_accum_dtype = DType::kBFloat16;
  opt.timeout = 30s;
  opt.layout = {.alignment = 4, .bucket_numel = 256, .block = 16};
  opt.offload.optimizer = run.offload;
  opt.offload.params = run.offload && run.stage == 3;
  if (run.fp32_storage) opt.param_dtype = DType::kBFloat16;
  return opt;
}

uint32_t bits_of(const void* p, DType dtype, size_t e) {
  if (dtype == DType::kBFloat16) return static_cast<const uint16_t*>(p)[e];
  uint32_t u;
  std::memcpy(&u, static_cast<const float*>(p) + e, 4);
  return u;
}
float value_of(const void* p, DType dtype, size_t e) {
  return dtype == DType::kBFloat16 ? bf16_bits_to_fp32(static_cast<const uint16_t*>(p)[e]) : static_cast<const float*>(p)[e];
}

Result train(comm::Communicator& comm, const Run& run) {
  testing::CountingCommunicator counting(comm);
  Engine engine(counting, options_for(run));
  std::vector<std::vector<float>> fp32(kModel.size());
  std::vector<std::vector<uint16_t>> bf16(kModel.size());
  std::vector<int> ids;
  for (size_t t = 0; t < kModel.size(); ++t) {
    const Tensor& m = kModel[t];
    const DType registered = run.fp32_storage ? DType::kFloat32 : m.dtype;
    ParamSpec spec{.name = m.name, .shape = {static_cast<int64_t>(m.numel)}, .dtype = registered, .unit = m.unit};
    if (run.fp32_storage && m.dtype == DType::kFloat32) spec.param_dtype = DType::kFloat32;
    for (size_t e = 0; e < m.numel; ++e) {
      fp32[t].push_back(initial(t, e));
      bf16[t].push_back(fp32_to_bf16_bits(initial(t, e)));
    }
    spec.data = registered == DType::kFloat32 ? StorageRef{fp32[t].data(), m.numel} : StorageRef{bf16[t].data(), m.numel};
    ids.push_back(engine.add_param(spec));
  }
  engine.finalize();
  if (!run.load_dir.empty()) engine.load(run.load_dir);
  Result r;
  auto read = [&](UnitScope& s, size_t t) {
    const void* p = s.param(ids[t]);
    std::vector<uint32_t> bits(kModel[t].numel);
    for (size_t e = 0; e < bits.size(); ++e) bits[e] = bits_of(p, kModel[t].dtype, e);
    r.reads.push_back(bits);
  };
  const int64_t bf16_before = counting.all_gather_bytes(DType::kBFloat16);
  const int64_t fp32_before = counting.all_gather_bytes(DType::kFloat32);
  for (int step = run.first_step; step < run.last_step; ++step) {
    for (int u = 0; u < kUnits; ++u) {
      UnitScope s = engine.gather(u);
      for (size_t t = 0; t < kModel.size(); ++t) {
        if (kModel[t].unit == u) read(s, t);
      }
    }
    for (int u = kUnits; u-- > 0;) {
      UnitScope s = engine.gather_for_backward(u);
      for (size_t t = 0; t < kModel.size(); ++t) {
        if (kModel[t].unit != u) continue;
        read(s, t);
        const void* p = s.param(ids[t]);
        void* g = s.grad(ids[t]);
        for (size_t e = 0; e < kModel[t].numel; ++e) {
          const float v = 0.01f * std::sin(0.37f * static_cast<float>(e) + 1.3f * static_cast<float>(comm.rank()) +
                                           0.7f * static_cast<float>(step) + static_cast<float>(t)) +
                          0.1f * value_of(p, kModel[t].dtype, e);
          if (kModel[t].dtype == DType::kBFloat16) {
            static_cast<uint16_t*>(g)[e] = fp32_to_bf16_bits(v);
          } else {
            static_cast<float*>(g)[e] = v;
          }
        }
      }
    }
    engine.step();
  }
  r.gather_bytes[DType::kBFloat16] = counting.all_gather_bytes(DType::kBFloat16) - bf16_before;
  r.gather_bytes[DType::kFloat32] = counting.all_gather_bytes(DType::kFloat32) - fp32_before;
  for (int u = 0; u < kUnits; ++u) {
    UnitScope s = engine.gather(u);
    for (size_t t = 0; t < kModel.size(); ++t) {
      if (kModel[t].unit != u) continue;
      const void* p = s.param(ids[t]);
      std::vector<uint32_t> bits(kModel[t].numel);
      for (size_t e = 0; e < bits.size(); ++e) bits[e] = bits_of(p, kModel[t].dtype, e);
      r.final.push_back(bits);
    }
  }
  if (!run.save_dir.empty()) engine.save(run.save_dir);
  return r;
}

std::vector<Result> train_on_ranks(const Run& run) {
  std::vector<Result> out(2);
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) { out[static_cast<size_t>(comm.rank())] = train(comm, run); });
  return out;
}

std::string tmp_dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace

TEST_CASE("bf16 matrices beside fp32 biases and norms train the same bits at stages 0-3, offloaded too") {
  const std::vector<Result> reference = train_on_ranks({.stage = 0});
  CHECK(reference[0].reads == reference[1].reads);
  for (const Run& run : {Run{.stage = 1}, Run{.stage = 2}, Run{.stage = 3}, Run{.stage = 2, .offload = true},
                        Run{.stage = 3, .offload = true}}) {
    CAPTURE(run.stage);
    CAPTURE(run.offload);
    const std::vector<Result> got = train_on_ranks(run);
    for (int r = 0; r < 2; ++r) {
      CHECK(got[static_cast<size_t>(r)].reads == reference[0].reads);
      CHECK(got[static_cast<size_t>(r)].final == reference[0].final);
    }
    if (run.stage == 3) {
      // Each dtype is gathered in its own collective, in its own dtype: every step gathers both.
      CHECK(got[0].gather_bytes.at(DType::kBFloat16) > 0);
      CHECK(got[0].gather_bytes.at(DType::kFloat32) > 0);
    } else {
      CHECK(got[0].gather_bytes.at(DType::kBFloat16) + got[0].gather_bytes.at(DType::kFloat32) > 0);
    }
  }
  // The fp32 parameters kept fp32 values: the update is not rounded to bf16 for them.
  bool wider_than_bf16 = false;
  for (size_t t = 0; t < kModel.size(); ++t) {
    if (kModel[t].dtype != DType::kFloat32) continue;
    for (uint32_t b : reference[0].final[t]) wider_than_bf16 = wider_than_bf16 || (b & 0xFFFFu) != 0;
  }
  CHECK(wider_than_bf16);
}

TEST_CASE("fp32 storage with a bf16 param_dtype and fp32 kept per parameter trains the mixed model's bits") {
  const std::vector<Result> registered = train_on_ranks({.stage = 3});
  for (bool offload : {false, true}) {
    CAPTURE(offload);
    const std::vector<Result> kept = train_on_ranks({.stage = 3, .offload = offload, .fp32_storage = true});
    CHECK(kept[0].reads == registered[0].reads);
    CHECK(kept[0].final == registered[0].final);
    CHECK(kept[0].gather_bytes == registered[0].gather_bytes);
  }
}

TEST_CASE("a mixed-dtype checkpoint saved at stage 3 resumes at stage 1 bit for bit") {
  const std::string dir = tmp_dir("mixed_dtype_ckpt");
  const std::vector<Result> whole = train_on_ranks({.stage = 3});
  train_on_ranks({.stage = 3, .last_step = 2, .save_dir = dir});
  const std::vector<Result> resumed = train_on_ranks({.stage = 1, .first_step = 2, .load_dir = dir});
  CHECK(resumed[0].final == whole[0].final);
  CHECK(resumed[1].final == whole[0].final);
}

TEST_CASE("what parameters of several dtypes cannot take is refused, naming the field") {
  testing::run_thread_ranks(1, [](comm::Communicator& comm) {
    std::vector<float> a(8);
    std::vector<uint16_t> b(8), c(8);
    std::vector<int32_t> i(8);
    auto engine_with = [&](EngineOptions opt, DType third) {
      opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
      opt.timeout = 10s;
      auto engine = std::make_unique<Engine>(comm, opt);
      engine->add_param({.name = "a", .shape = {8}, .dtype = DType::kFloat32, .data = {a.data(), 8}});
      engine->add_param({.name = "b", .shape = {8}, .dtype = DType::kBFloat16, .data = {b.data(), 8}});
      if (third == DType::kInt32) {
        engine->add_param({.name = "i", .shape = {8}, .dtype = third, .data = {i.data(), 8}});
      } else {
        engine->add_param({.name = "c", .shape = {8}, .dtype = third, .data = {c.data(), 8}});
      }
      engine->finalize();
      return engine;
    };
    EngineOptions fp16_reduce;
    fp16_reduce.reduce_dtype = DType::kFloat16;
    CHECK_THROWS_WITH_AS(engine_with(fp16_reduce, DType::kBFloat16),
                         doctest::Contains("EngineOptions.reduce_dtype fp16 must be fp32 or the dtype gradients are "
                                           "written in (fp32 and bf16"),
                         InvalidArgument);
    // A 16-bit accumulation keeps each bucket's own dtype: with fp16 and bf16 beside fp32 there is none.
    EngineOptions bf16_accum;
    bf16_accum.grad_accum_dtype = DType::kBFloat16;
    CHECK_THROWS_WITH_AS(engine_with(bf16_accum, DType::kFloat16), doctest::Contains("EngineOptions.grad_accum_dtype bf16"),
                         InvalidArgument);
    // ParamSpec.param_dtype: narrowing an fp32 parameter, at stage 3 only.
    {
      EngineOptions stage2;
      stage2.stage = 2;
      stage2.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
      Engine engine(comm, stage2);
      engine.add_param({.name = "w", .shape = {8}, .dtype = DType::kFloat32, .data = {a.data(), 8},
                        .param_dtype = DType::kBFloat16});
      CHECK_THROWS_WITH_AS(engine.finalize(), doctest::Contains("parameter 'w': ParamSpec.param_dtype bf16 needs stage 3"),
                           InvalidArgument);
      Engine other(comm, stage2);
      other.add_param({.name = "b", .shape = {8}, .dtype = DType::kBFloat16, .data = {b.data(), 8},
                       .param_dtype = DType::kFloat32});
      CHECK_THROWS_WITH_AS(other.finalize(),
                           doctest::Contains("parameter 'b': ParamSpec.param_dtype fp32 with dtype bf16: it must be "
                                             "the registered dtype, or fp16 or bf16 for an fp32 parameter"),
                           InvalidArgument);
    }
    CHECK_THROWS_WITH_AS(engine_with({}, DType::kInt32),
                         doctest::Contains("parameter 'i': dtype int32 is not fp32, fp16 or bf16"),
                         InvalidArgument);
    // A 16-bit export needs one dtype; the fp32 export (from the master) is every parameter's.
    auto engine = engine_with({}, DType::kBFloat16);
    const std::string dir = tmp_dir("mixed_dtype_export");
    std::filesystem::create_directories(dir);
    CHECK_THROWS_WITH_AS(engine->export_safetensors(dir + "/w.safetensors", DType::kBFloat16),
                         doctest::Contains("the parameters mix dtypes"), InvalidArgument);
    engine->export_safetensors(dir + "/w.safetensors", DType::kFloat32);
    CHECK(std::filesystem::file_size(dir + "/w.safetensors") > 0);
  });
}

}  // namespace zero
