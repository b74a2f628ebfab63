// Checkpoints in one process (ranks as threads): a load that fails on one rank fails on every rank
// and leaves every engine as it was; the user blobs and the step come back.
#include "zero/checkpoint/checkpoint.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "base/error.h"
#include "testing/thread_ranks.h"
#include "zero/checkpoint/checkpoint_offline.h"
#include "zero/checkpoint/latest_checkpoint.h"
#include "zero/checkpoint/safetensors.h"
#include "zero/engine.h"

namespace zero {
namespace {

namespace fs = std::filesystem;

std::string tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Model {
  std::vector<std::vector<float>> values{std::vector<float>(70, 0.5f), std::vector<float>(9, -0.25f)};
};

// An engine over `c` with the two tensors registered and `steps` steps of synthetic gradients taken.
std::unique_ptr<Engine> trained(comm::Communicator& c, Model& m, int stage, int steps,
                                DType state_dtype = DType::kFloat32) {
  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
  opt.optimizer.state_dtype = state_dtype;
  opt.layout = {.alignment = 4, .bucket_numel = 32, .block = 16};
  opt.timeout = std::chrono::seconds(30);
  auto e = std::make_unique<Engine>(c, opt);
  std::vector<int> ids;
  for (size_t t = 0; t < m.values.size(); ++t) {
    ids.push_back(e->add_param({.name = "t" + std::to_string(t), .shape = {static_cast<int64_t>(m.values[t].size())},
                                .dtype = DType::kFloat32, .data = {m.values[t].data(), m.values[t].size()},
                                .unit = static_cast<int>(t)}));
  }
  e->finalize();
  for (int s = 0; s < steps; ++s) {
    for (size_t t = 0; t < ids.size(); ++t) {
      auto scope = e->gather_for_backward(static_cast<int>(t));
      float* g = scope.grad_as<float>(ids[t]);
      for (size_t i = 0; i < m.values[t].size(); ++i) g[i] += 0.01f * static_cast<float>((i + 1) * (s + 1 + c.rank()));
    }
    e->step();
  }
  return e;
}

// An engine holding tensors `which` of Model (a pipeline stage's part), `steps` steps taken; its
// parameters' values in `values`.
std::unique_ptr<Engine> trained_part(comm::Communicator& c, std::vector<std::vector<float>>& values,
                                     const std::vector<size_t>& which, int steps) {
  EngineOptions opt;
  opt.stage = 1;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
  opt.layout = {.alignment = 4, .bucket_numel = 32, .block = 16};
  opt.timeout = std::chrono::seconds(30);
  auto e = std::make_unique<Engine>(c, opt);
  const Model whole;
  values.clear();
  for (size_t t : which) values.push_back(whole.values[t]);
  for (size_t k = 0; k < which.size(); ++k) {
    e->add_param({.name = "t" + std::to_string(which[k]), .shape = {static_cast<int64_t>(values[k].size())},
                  .dtype = DType::kFloat32, .data = {values[k].data(), values[k].size()}, .unit = static_cast<int>(which[k])});
  }
  e->finalize();
  for (int s = 0; s < steps; ++s) {
    for (size_t k = 0; k < which.size(); ++k) {
      auto scope = e->gather_for_backward(static_cast<int>(which[k]));
      float* g = scope.grad_as<float>(static_cast<int>(k));
      for (size_t i = 0; i < values[k].size(); ++i) g[i] += 0.01f * static_cast<float>((i + 1) * (s + 1));
    }
    e->step();
  }
  return e;
}

}  // namespace

TEST_CASE("a model saved in parts (pipeline stages) loads from all of them into an engine split otherwise") {
  const std::string dir = tmp("threads_ckpt_parts");
  testing::run_thread_ranks(2, [&](comm::Communicator& c) {
    std::vector<std::vector<float>> a, b, whole;
    trained_part(c, a, {0}, 2)->save(dir + "/stage0");
    trained_part(c, b, {1}, 2)->save(dir + "/stage1");
    trained_part(c, whole, {1}, 3)->save(dir + "/late");  // another step count
    auto e = trained_part(c, whole, {0, 1}, 0);
    const LoadedCheckpoint loaded = e->load({dir + "/stage0", dir + "/stage1"});
    CHECK(loaded.state.step == 2);
    CHECK(whole[0] == a[0]);  // stage 1 writes the parameters back into the registered storage
    CHECK(whole[1] == b[0]);
    // A part no directory holds, and parts saved at different steps, fail naming them.
    CHECK_THROWS_WITH_AS(e->load({dir + "/stage0"}), doctest::Contains("has no parameter 't1'"), Error);
    CHECK_THROWS_WITH_AS(e->load({dir + "/stage0", dir + "/late"}), doctest::Contains("was saved at step 3 but"), Error);
  });
}

TEST_CASE("a load that fails on one rank fails on every rank and changes nothing") {
  const std::string dir = tmp("threads_ckpt");
  std::mutex mu;
  std::vector<std::string> errors;
  testing::run_thread_ranks(2, [&](comm::Communicator& c) {
    Model m;
    auto e = trained(c, m, 2, 2);
    e->save(dir, "blob of rank " + std::to_string(c.rank()));
    e->export_safetensors(dir + "_before.safetensors");
    // One more step, so that the engine's state differs from the checkpoint's.
    auto scope = e->gather_for_backward(0);
    scope.grad_as<float>(0)[0] = 1.0f;
    scope.close();
    e->step();
    const std::string after = dir + "_after.safetensors";
    e->export_safetensors(after);
    c.barrier()->wait();
    if (c.rank() == 0) {
      // Damage a piece only rank 1 reads.
      std::fstream f(dir + "/rank-00001.bin", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(3);
      f.put('\x7f');
    }
    c.barrier()->wait();
    try {
      e->load(dir);
    } catch (const IoError& x) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(x.what());
    }
    // Nothing changed: the weights are still those of the third step.
    const std::string again = dir + "_again.safetensors";
    e->export_safetensors(again);
    CHECK(slurp(again) == slurp(after));
    CHECK(slurp(again) != slurp(dir + "_before.safetensors"));
    CHECK(e->steps_taken() == 3);
  });
  REQUIRE(errors.size() == 2);
  for (const std::string& x : errors) {
    CAPTURE(x);
    CHECK(x.find("rank-00001.bin") != std::string::npos);
    CHECK(x.find("checksum mismatch") != std::string::npos);
  }
}

TEST_CASE("a load restores the step, the weights and every rank's blob, at another stage") {
  const std::string dir = tmp("threads_ckpt_b");
  testing::run_thread_ranks(2, [&](comm::Communicator& c) {
    Model m;
    auto e = trained(c, m, 1, 2);
    e->save(dir, "blob " + std::to_string(c.rank()));
    e->export_safetensors(dir + "_saved.safetensors");
    Model fresh;
    auto f = trained(c, fresh, 3, 0);
    const LoadedCheckpoint got = f->load(dir);
    CHECK(got.state.step == 2);
    CHECK(got.world_size == 2);
    CHECK(got.stage == 1);
    CHECK(got.user_blobs == std::vector<std::string>{"blob 0", "blob 1"});
    CHECK(f->steps_taken() == 2);
    f->export_safetensors(dir + "_loaded.safetensors");
    c.barrier()->wait();
    CHECK(slurp(dir + "_loaded.safetensors") == slurp(dir + "_saved.safetensors"));
    c.barrier()->wait();
  });
}

TEST_CASE("a checkpoint of format version 1 (before tensor parallelism) still loads; a newer version is refused") {
  const std::string dir = tmp("threads_ckpt_v1");
  testing::run_thread_ranks(2, [&](comm::Communicator& c) {
    Model m;
    auto e = trained(c, m, 2, 2);
    e->save(dir);
    e->export_safetensors(dir + "_saved.safetensors");
    c.barrier()->wait();
    // Version 1 is version 3 without the layout (and without tp parts, which need tp above 1, and
    // encoded state pieces, which AdamW's state has none of).
    if (c.rank() == 0) {
      nlohmann::json doc = nlohmann::json::parse(slurp(dir + "/manifest.json"));
      CHECK(doc["version"] == 3);
      doc["version"] = 1;
      doc.erase("layout");
      std::ofstream(dir + "/manifest.json") << doc.dump(1);
    }
    c.barrier()->wait();
    Model fresh;
    auto f = trained(c, fresh, 3, 0);
    const LoadedCheckpoint got = f->load(dir);
    CHECK(got.state.step == 2);
    CHECK(got.world_size == 2);
    f->export_safetensors(dir + "_loaded.safetensors");
    c.barrier()->wait();
    CHECK(slurp(dir + "_loaded.safetensors") == slurp(dir + "_saved.safetensors"));
    if (c.rank() == 0) {
      nlohmann::json doc = nlohmann::json::parse(slurp(dir + "/manifest.json"));
      doc["version"] = 4;
      std::ofstream(dir + "/manifest.json") << doc.dump(1);
    }
    c.barrier()->wait();
    CHECK_THROWS_WITH_AS(f->load(dir), doctest::Contains("format version 4 (this build reads 1 to 3)"), IoError);
  });
}

// One more step with the same gradient on each rank.
void step_once(Engine& e) {
  auto scope = e.gather_for_backward(0);
  scope.grad_as<float>(0)[5] = 0.75f;
  scope.close();
  e.step();
}

TEST_CASE("bf16 optimizer state comes back exactly: the next step after a load equals the next step after the save") {
  // bf16 state is not in place: it is widened on save and rounded (exactly) on load, through the
  // shard optimizer's read_state/write_state, the path a GPU's state takes too.
  const std::string dir = tmp("threads_ckpt_bf16");
  testing::run_thread_ranks(2, [&](comm::Communicator& c) {
    Model m;
    auto e = trained(c, m, 2, 3, DType::kBFloat16);
    e->save(dir);
    step_once(*e);
    e->export_safetensors(dir + "_continued.safetensors");
    Model fresh;
    auto f = trained(c, fresh, 1, 0, DType::kBFloat16);
    f->load(dir);
    step_once(*f);
    f->export_safetensors(dir + "_resumed.safetensors");
    c.barrier()->wait();
    CHECK(slurp(dir + "_resumed.safetensors") == slurp(dir + "_continued.safetensors"));
    c.barrier()->wait();
  });
}

TEST_CASE("an async save holds the state of when it was called while training goes on") {
  const std::string dir = tmp("threads_ckpt_async");
  testing::run_thread_ranks(2, [&](comm::Communicator& c) {
    Model m;
    auto e = trained(c, m, 2, 2);
    e->export_safetensors(dir + "_at_save.safetensors");
    e->save_async(dir, "async " + std::to_string(c.rank()));
    // Training goes on while the files are written.
    for (int s = 0; s < 2; ++s) {
      auto scope = e->gather_for_backward(1);
      scope.grad_as<float>(1)[0] = 1.0f;
      scope.close();
      e->step();
    }
    e->wait_for_save();
    CHECK(fs::exists(dir + "/manifest.json"));
    Model fresh;
    auto f = trained(c, fresh, 3, 0);
    CHECK(f->load(dir).user_blobs == std::vector<std::string>{"async 0", "async 1"});
    f->export_safetensors(dir + "_loaded.safetensors");
    c.barrier()->wait();
    CHECK(slurp(dir + "_loaded.safetensors") == slurp(dir + "_at_save.safetensors"));
    c.barrier()->wait();
    // The snapshot's memory is kept for the next save until released.
    CHECK(e->save_staging_bytes() > 0);
    e->release_save_staging();
    CHECK(e->save_staging_bytes() == 0);
    // A second async save waits for nothing: the first is done; destroying the engine joins it.
    e->save_async(dir, "again");
  });
  CHECK(fs::exists(dir + "/manifest.json"));
}

TEST_CASE("import from safetensors, with a name map, at another stage and world size") {
  const std::string file = tmp("import_src.safetensors");
  testing::run_thread_ranks(2, [&](comm::Communicator& c) {
    Model m;
    auto e = trained(c, m, 2, 2);
    e->export_safetensors(file);
  });
  testing::run_thread_ranks(3, [&](comm::Communicator& c) {
    // Registered under other names: the map points them at the file's.
    Model fresh;
    EngineOptions opt;
    opt.stage = 3;
    opt.layout = {.alignment = 4, .bucket_numel = 32, .block = 16};
    Engine e(c, opt);
    for (size_t t = 0; t < fresh.values.size(); ++t) {
      e.add_param({.name = "renamed" + std::to_string(t), .shape = {static_cast<int64_t>(fresh.values[t].size())},
                   .dtype = DType::kFloat32, .data = {fresh.values[t].data(), fresh.values[t].size()},
                   .unit = static_cast<int>(t)});
    }
    e.finalize();
    e.import_safetensors(file, {{"renamed0", "t0"}, {"renamed1", "t1"}});
    const std::string back = tmp("import_back.safetensors");
    e.export_safetensors(back);
    c.barrier()->wait();
    // The same data; only the names in the header differ.
    const std::string a = slurp(file), b = slurp(back);
    CHECK(a.substr(a.size() - 79 * 4) == b.substr(b.size() - 79 * 4));
    // A missing tensor is named, on every rank, and changes nothing.
    CHECK_THROWS_WITH_AS(e.import_safetensors(file), doctest::Contains("no tensor 'renamed0'"), IoError);
    c.barrier()->wait();
  });
}

TEST_CASE("frozen parameters are saved, loaded, exported and imported whole") {
  const std::string dir = tmp("threads_ckpt_frozen");
  const std::string file = tmp("frozen.safetensors");
  testing::run_thread_ranks(2, [&](comm::Communicator& c) {
    auto make = [&](std::vector<float>& w, std::vector<uint16_t>& frozen) {
      EngineOptions opt;
      opt.stage = 2;
      opt.layout = {.alignment = 4, .bucket_numel = 32, .block = 16};
      auto e = std::make_unique<Engine>(c, opt);
      e->add_param({.name = "w", .shape = {40}, .dtype = DType::kFloat32, .data = {w.data(), w.size()}});
      e->add_param({.name = "embedding", .shape = {3, 5}, .dtype = DType::kBFloat16,
                    .data = {frozen.data(), frozen.size()}, .unit = 1, .requires_grad = false});
      e->finalize();
      return e;
    };
    std::vector<float> w(40, 0.5f);
    std::vector<uint16_t> frozen(15);
    for (size_t i = 0; i < frozen.size(); ++i) frozen[i] = fp32_to_bf16_bits(0.25f * static_cast<float>(i));
    {
      auto e = make(w, frozen);
      e->save(dir);
      e->export_safetensors(file);
    }
    // A fresh engine whose frozen storage holds something else: load restores it on every rank.
    std::vector<float> w2(40, 9.0f);
    std::vector<uint16_t> other(15, fp32_to_bf16_bits(-1.0f));
    auto f = make(w2, other);
    f->load(dir);
    CHECK(other == frozen);
    std::fill(other.begin(), other.end(), fp32_to_bf16_bits(-1.0f));
    f->import_safetensors(file);
    CHECK(other == frozen);
    c.barrier()->wait();
  });
  // The export holds both tensors, the frozen one widened to fp32.
  const SafetensorsLayout layout = read_safetensors_header(file);
  REQUIRE(layout.tensors.size() == 2);
  CHECK(layout.tensors[1].name == "embedding");
  CHECK(layout.tensors[1].end - layout.tensors[1].begin == 15 * 4);
  const std::string bytes = slurp(file);
  float v = 0;
  std::memcpy(&v, bytes.data() + layout.data_start + layout.tensors[1].begin + 4 * 4, 4);
  CHECK(v == 1.0f);
  // The offline export has the same bits.
  export_checkpoint(dir, file + ".offline", DType::kFloat32);
  CHECK(slurp(file + ".offline") == bytes);
}

}  // namespace zero

namespace zero {
namespace {

TEST_CASE("the latest complete checkpoint: DIR, DIR.old left by a save killed between its renames, or none") {
  const std::string dir = tmp("threads_ckpt_latest");
  fs::remove_all(dir);
  fs::remove_all(dir + ".old");
  CHECK_FALSE(latest_checkpoint(dir).has_value());  // a run that never saved
  testing::run_thread_ranks(2, [&](comm::Communicator& c) {
    Model m;
    auto e = trained(c, m, 2, 3);
    e->save(dir);
  });
  std::optional<FoundCheckpoint> found = latest_checkpoint(dir);
  REQUIRE(found.has_value());
  CHECK(found->dir == dir);
  CHECK(found->step == 3);

  // Killed after DIR -> DIR.old and before DIR.partial -> DIR: the previous save is in DIR.old.
  fs::rename(dir, dir + ".old");
  found = latest_checkpoint(dir);
  REQUIRE(found.has_value());
  CHECK(found->dir == dir + ".old");
  CHECK(found->step == 3);

  // A DIR whose data file is cut short is passed over, and says why.
  fs::copy(dir + ".old", dir, fs::copy_options::recursive);
  fs::resize_file(dir + "/rank-00001.bin", 8);
  std::vector<std::string> why;
  found = latest_checkpoint(dir, &why);
  REQUIRE(found.has_value());
  CHECK(found->dir == dir + ".old");
  REQUIRE(why.size() == 1);
  CAPTURE(why[0]);
  CHECK(why[0].find("'" + dir + "' is not complete") != std::string::npos);
  CHECK(why[0].find("rank-00001.bin") != std::string::npos);
}

}  // namespace
}  // namespace zero
