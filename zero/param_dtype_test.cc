// EngineOptions.param_dtype (stage 3's mixed precision, FSDP2's MixedPrecisionPolicy.param_dtype):
// fp32 parameters trained with a bf16 param_dtype are the bf16-registered model trained from the same
// values, bit for bit (the shard is the master rounded either way), with and without offload; and
// their parameter all-gathers, counted by the communicator, carry half the bytes of the fp32 run's;
// their checkpoint holds the fp32 master and loads without param_dtype. Also what the views and the
// options refuse.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
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

const std::vector<size_t> kSizes = {300, 40, 1000};  // one single-tensor unit each
constexpr int kSteps = 4;

// Initial values exactly representable in bf16, so the two registrations start from the same master.
float initial(size_t u, size_t e) {
  return bf16_bits_to_fp32(fp32_to_bf16_bits(std::cos(0.1f * static_cast<float>(e) + static_cast<float>(u))));
}

enum class Registered { kFp32, kBf16, kFp32AsBf16 };  // kFp32AsBf16: fp32 storage, param_dtype bf16

struct Run {
  Registered registered = Registered::kFp32;
  bool offload = false;
};

struct Result {
  std::vector<std::vector<uint16_t>> reads;  // every parameter read in a scope, as bf16 bits
  int64_t gather_bytes = 0;  // all-gathered in the engine's parameter dtype over the steps
};

Result train(comm::Communicator& comm, const Run& run) {
  testing::CountingCommunicator counting(comm);
  EngineOptions opt;
  opt.stage = 3;
  opt.optimizer.kind = optim::OptimizerKind::kAdamW;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
  opt.max_grad_norm = 1.0f;
  opt.deterministic = true;
  opt.timeout = 30s;
  opt.layout = {.alignment = 4, .bucket_numel = 256, .block = 16};
  opt.offload.optimizer = opt.offload.params = run.offload;
  if (run.registered == Registered::kFp32AsBf16) opt.param_dtype = DType::kBFloat16;
  Engine engine(counting, opt);
  const bool fp32_storage = run.registered != Registered::kBf16;
  std::vector<std::vector<float>> fp32(kSizes.size());
  std::vector<std::vector<uint16_t>> bf16(kSizes.size());
  std::vector<int> ids;
  for (size_t u = 0; u < kSizes.size(); ++u) {
    for (size_t e = 0; e < kSizes[u]; ++e) {
      fp32[u].push_back(initial(u, e));
      bf16[u].push_back(fp32_to_bf16_bits(initial(u, e)));
    }
    ParamSpec spec{.name = "unit" + std::to_string(u) + ".w", .shape = {static_cast<int64_t>(kSizes[u])},
                   .unit = static_cast<int>(u)};
    spec.dtype = fp32_storage ? DType::kFloat32 : DType::kBFloat16;
    spec.data = fp32_storage ? StorageRef{fp32[u].data(), kSizes[u]} : StorageRef{bf16[u].data(), kSizes[u]};
    ids.push_back(engine.add_param(spec));
  }
  engine.finalize();
  const bool narrow = run.registered != Registered::kFp32;  // the engine's parameters are bf16
  Result r;
  // The unit's parameters as fp32 values, recording their bf16 bits.
  auto read = [&](UnitScope& s, size_t u) {
    std::vector<float> p(kSizes[u]);
    std::vector<uint16_t> bits(kSizes[u]);
    for (size_t e = 0; e < kSizes[u]; ++e) {
      if (narrow) {
        bits[e] = s.param_as<uint16_t>(ids[u])[e];
        p[e] = bf16_bits_to_fp32(bits[e]);
      } else {
        p[e] = s.param_as<float>(ids[u])[e];
        bits[e] = fp32_to_bf16_bits(p[e]);
      }
    }
    r.reads.push_back(std::move(bits));
    return p;
  };
  const DType gathered = narrow ? DType::kBFloat16 : DType::kFloat32;
  const int64_t before = counting.all_gather_bytes(gathered);
  for (int step = 0; step < kSteps; ++step) {
    for (size_t u = 0; u < kSizes.size(); ++u) {
      UnitScope s = engine.gather(static_cast<int>(u));
      read(s, u);
    }
    for (size_t u = kSizes.size(); u-- > 0;) {
      UnitScope s = engine.gather_for_backward(static_cast<int>(u));
      const std::vector<float> p = read(s, u);
      for (size_t e = 0; e < kSizes[u]; ++e) {
        const float g = 0.01f * std::sin(0.37f * static_cast<float>(e) + 1.3f * static_cast<float>(comm.rank()) +
                                         0.7f * static_cast<float>(step) + static_cast<float>(u)) +
                        0.1f * p[e];
        if (narrow) {
          s.grad_as<uint16_t>(ids[u])[e] = fp32_to_bf16_bits(g);
        } else {
          s.grad_as<float>(ids[u])[e] = g;
        }
      }
    }
    engine.step();
  }
  r.gather_bytes = counting.all_gather_bytes(gathered) - before;
  return r;
}

std::vector<Result> train_on_ranks(const Run& run) {
  std::vector<Result> out(2);
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) { out[static_cast<size_t>(comm.rank())] = train(comm, run); });
  return out;
}

TEST_CASE("fp32 parameters with a bf16 param_dtype train as the bf16 model does, gathering half the fp32 bytes") {
  const std::vector<Result> bf16 = train_on_ranks({Registered::kBf16});
  const std::vector<Result> fp32 = train_on_ranks({Registered::kFp32});
  for (bool offload : {false, true}) {
    CAPTURE(offload);
    const std::vector<Result> mixed = train_on_ranks({Registered::kFp32AsBf16, offload});
    for (size_t rank = 0; rank < 2; ++rank) {
      CAPTURE(rank);
      REQUIRE(mixed[rank].reads.size() == bf16[rank].reads.size());
      for (size_t i = 0; i < mixed[rank].reads.size(); ++i) {
        CAPTURE(i);
        CHECK(mixed[rank].reads[i] == bf16[rank].reads[i]);
      }
      // The same gathers as the bf16 model, and half the fp32 run's bytes. (The step's other
      // all-gathers, the order check's hash and the norm's block sums, are int64 and fp64.)
      CHECK(mixed[rank].gather_bytes == bf16[rank].gather_bytes);
      CHECK(2 * mixed[rank].gather_bytes == fp32[rank].gather_bytes);
      CHECK(mixed[rank].gather_bytes > 0);
      MESSAGE("rank " << rank << ": gathered " << fp32[rank].gather_bytes << " bytes in fp32, "
                      << mixed[rank].gather_bytes << " with param_dtype bf16");
    }
  }
  // The values did move: the bf16 run is not the fp32 one.
  CHECK(bf16[0].reads.back() != fp32[0].reads.back());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_CASE("a checkpoint saved with param_dtype holds the fp32 master: it loads without it, at another stage") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/param_dtype_ckpt";
  std::filesystem::remove_all(dir);
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    auto engine_for = [&](int stage, std::optional<DType> param_dtype, std::vector<std::vector<float>>& storage) {
      EngineOptions opt;
      opt.stage = stage;
      opt.param_dtype = param_dtype;
      opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
      opt.timeout = 30s;
      opt.layout = {.alignment = 4, .bucket_numel = 256, .block = 16};
      auto engine = std::make_unique<Engine>(comm, opt);
      storage.assign(kSizes.size(), {});
      for (size_t u = 0; u < kSizes.size(); ++u) {
        for (size_t e = 0; e < kSizes[u]; ++e) storage[u].push_back(std::cos(0.3f * static_cast<float>(e) + 1.0f));
        engine->add_param({.name = "unit" + std::to_string(u) + ".w", .shape = {static_cast<int64_t>(kSizes[u])},
                           .dtype = DType::kFloat32, .data = {storage[u].data(), kSizes[u]}, .unit = static_cast<int>(u)});
      }
      engine->finalize();
      return engine;
    };
    std::vector<std::vector<float>> a_storage, b_storage;
    {
      auto a = engine_for(3, DType::kBFloat16, a_storage);
      for (int step = 0; step < 2; ++step) {
        for (size_t u = kSizes.size(); u-- > 0;) {
          UnitScope s = a->gather_for_backward(static_cast<int>(u));
          uint16_t* g = s.grad_as<uint16_t>(static_cast<int>(u));
          for (size_t e = 0; e < kSizes[u]; ++e) g[e] = fp32_to_bf16_bits(0.01f * static_cast<float>(e % 7) - 0.02f);
        }
        a->step();
      }
      a->save(dir);
      a->export_safetensors(dir + "/a.safetensors");
    }
    auto b = engine_for(2, std::nullopt, b_storage);
    b->load(dir);
    b->export_safetensors(dir + "/b.safetensors");
    if (comm.rank() == 0) {
      const std::string a_bytes = read_file(dir + "/a.safetensors");
      CHECK(!a_bytes.empty());
      CHECK(read_file(dir + "/b.safetensors") == a_bytes);
    }
    // Stage 2 keeps the parameters in the registered storage: the master, fp32, not bf16 values.
    bool wider_than_bf16 = false;
    for (const std::vector<float>& t : b_storage) {
      for (float x : t) wider_than_bf16 = wider_than_bf16 || bf16_bits_to_fp32(fp32_to_bf16_bits(x)) != x;
    }
    CHECK(wider_than_bf16);
  });
}

TEST_CASE("views and options that do not fit param_dtype are refused, naming the parameter or field") {
  testing::run_thread_ranks(1, [](comm::Communicator& comm) {
    EngineOptions opt;
    opt.stage = 3;
    opt.param_dtype = DType::kBFloat16;
    opt.timeout = 30s;
    Engine engine(comm, opt);
    std::vector<float> w(64, 0.5f);
    const int id = engine.add_param({.name = "w", .shape = {64}, .dtype = DType::kFloat32, .data = {w.data(), 64}});
    engine.finalize();
    {
      UnitScope s = engine.gather_for_backward(0);
      CHECK_THROWS_WITH_AS(s.param_as<float>(id),
                           "parameter 'w' (id 0) is bf16 in the engine (EngineOptions.param_dtype): it cannot be "
                           "viewed as float (use BFloat16 or uint16_t)",
                           InvalidArgument);
      CHECK_THROWS_AS(engine.grad_as<float>(id), InvalidArgument);
      CHECK(s.param_span<uint16_t>(id).size() == 64);
      CHECK(s.grad_span<BFloat16>(id).size() == 64);
    }
    engine.step();
  });
  EngineOptions below;
  below.stage = 2;
  below.param_dtype = DType::kBFloat16;
  CHECK_THROWS_WITH_AS(validate(below),
                       "EngineOptions.param_dtype bf16 needs stage 3 (got stage 2): below it the parameters are your "
                       "registered storage, so register them in the dtype to compute in (the engine keeps the fp32 "
                       "master)",
                       InvalidArgument);
}

}  // namespace
}  // namespace zero
