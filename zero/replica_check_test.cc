// EngineOptions::replica_check_every on thread ranks: no false alarm at any stage (with hybrid
// sharding too); a bit flipped in one replica's parameter is caught at the next check, on every
// rank, naming the tensor, the rank outside the majority and the step; at stage 3 under hybrid
// sharding, replicas of a shard that differ are caught too, and so is a unit whose gathered copy
// differs on one rank (corrupted in flight).
#include "zero/replica_check.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/fault_injection.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero {
namespace {

struct Model {
  std::vector<float> w = std::vector<float>(70, 0.5f), b = std::vector<float>(9, -0.25f);
  std::vector<float> f = std::vector<float>(12, 2.0f);  // frozen: every rank holds it, nothing rewrites it
};

EngineOptions options(int stage, int every) {
  EngineOptions o;
  o.stage = stage;
  o.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
  o.layout = {.alignment = 4, .bucket_numel = 32, .block = 16};
  o.timeout = std::chrono::seconds(30);
  o.replica_check_every = every;
  return o;
}

// Registers w and b (unit 0 and 1); `tweak` may change this rank's values before finalize.
std::unique_ptr<Engine> engine(const EngineComms& comms, Model& m, const EngineOptions& o) {
  auto e = std::make_unique<Engine>(comms, o);
  e->add_param({.name = "w", .shape = {70}, .dtype = DType::kFloat32, .data = {m.w.data(), m.w.size()}, .unit = 0});
  e->add_param({.name = "b", .shape = {9}, .dtype = DType::kFloat32, .data = {m.b.data(), m.b.size()}, .unit = 1});
  e->add_param({.name = "f", .shape = {12}, .dtype = DType::kFloat32, .data = {m.f.data(), m.f.size()}, .unit = 1,
                .requires_grad = false});
  e->finalize();
  return e;
}

std::string tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// The model's weights as a safetensors file, through a one-rank engine.
void write_weights(const std::string& path, Model m) {
  testing::run_thread_ranks(1, [&](comm::Communicator& c) { engine(EngineComms{&c}, m, options(1, 0))->export_safetensors(path); });
}

// One step of synthetic gradients that differ by rank (the reduction makes them alike), each unit's
// forward scope opened first (at stage 3 its gather is what the check compares).
void step(Engine& e, int rank, int s) {
  for (int unit : {0, 1}) e.gather(unit).close();
  for (int unit : {0, 1}) {
    auto scope = e.gather_for_backward(unit);
    float* g = scope.grad_as<float>(unit);
    const size_t n = unit == 0 ? 70 : 9;
    for (size_t i = 0; i < n; ++i) g[i] += 0.01f * static_cast<float>((i + 1) * (s + 1 + rank));
  }
  e.step();
}

TEST_CASE("no false alarm: every step checked at stages 0-3, and with hybrid sharding 2 x 2 at stages 1-3") {
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    testing::run_thread_ranks(4, [&](comm::Communicator& c) {
      Model m;
      auto e = engine(EngineComms{&c}, m, options(stage, 1));
      for (int s = 0; s < 3; ++s) step(*e, c.rank(), s);
    });
    if (stage == 0) continue;  // hybrid sharding shards state within a group: stages 1-3
    testing::run_thread_ranks(4, [&](comm::Communicator& c) {
      auto shard = c.split(c.rank() / 2, c.rank());
      auto replica = c.split(c.rank() % 2, c.rank());
      Model m;
      auto e = engine(EngineComms{shard.get(), replica.get()}, m, options(stage, 1));
      for (int s = 0; s < 3; ++s) step(*e, c.rank(), s);
    });
  }
}

// Each rank's error from `steps` steps of an engine at `stage` checked every 2 steps; `corrupt` may
// change this rank's model after a step (its index) or before the engine (-1).
std::vector<std::string> run_checked(int stage, int steps, const std::function<void(int rank, int after, Model&)>& corrupt) {
  std::vector<std::string> errors(3);
  std::mutex mu;
  testing::run_thread_ranks(3, [&](comm::Communicator& c) {
    Model m;
    corrupt(c.rank(), -1, m);
    auto e = engine(EngineComms{&c}, m, options(stage, 2));
    try {
      for (int s = 0; s < steps; ++s) {
        step(*e, c.rank(), s);
        corrupt(c.rank(), s, m);
      }
    } catch (const Error& err) {
      std::lock_guard<std::mutex> lock(mu);
      errors[static_cast<size_t>(c.rank())] = err.what();
    }
  });
  return errors;
}

void flip_bit(float& v, int bit) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits ^= 1u << bit;
  std::memcpy(&v, &bits, 4);
}

TEST_CASE("a bit flipped in rank 2's copy of a frozen parameter after step 2 is caught at step 4, on every rank") {
  for (int stage = 0; stage <= 2; ++stage) {
    CAPTURE(stage);
    // A low mantissa bit: the value moves by a few parts in 10^5, and nothing rewrites it.
    const auto errors = run_checked(stage, 4, [](int rank, int after, Model& m) {
      if (rank == 2 && after == 1) flip_bit(m.f[5], 9);
    });
    for (const std::string& e : errors) {
      CAPTURE(e);
      CHECK(e.find("replicas disagree after step 4 in the data-parallel group: parameter 'f' on rank 2 differs "
                   "from ranks 0, 1 (CRC32C ") != std::string::npos);
      CHECK(e.find("parameter 'w'") == std::string::npos);
    }
  }
}

// A replica loaded from other weights than its peers (the bits that reached it differ): import is
// each rank's own read, so one rank reading another file stands for its copy corrupted at rest.
std::vector<std::string> run_imported(int world, int stage, bool hybrid, int odd_rank) {
  const std::string same = tmp("replica_same.safetensors"), odd = tmp("replica_odd.safetensors");
  write_weights(same, Model{});
  Model other;
  flip_bit(other.b[4], 12);
  flip_bit(other.w[60], 12);  // in the second half of the stage 3 shard space (w[48, 70) at 2 ranks)
  write_weights(odd, other);
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::mutex mu;
  testing::run_thread_ranks(world, [&](comm::Communicator& c) {
    std::unique_ptr<comm::Communicator> shard, replica;
    if (hybrid) {
      shard = c.split(c.rank() / 2, c.rank());
      replica = c.split(c.rank() % 2, c.rank());
    }
    Model m;
    auto e = engine(hybrid ? EngineComms{shard.get(), replica.get()} : EngineComms{&c}, m, options(stage, 1));
    try {
      e->import_safetensors(c.rank() == odd_rank ? odd : same);
      step(*e, c.rank(), 0);
    } catch (const Error& err) {
      std::lock_guard<std::mutex> lock(mu);
      errors[static_cast<size_t>(c.rank())] = err.what();
    }
  });
  return errors;
}

TEST_CASE("stage 0's replicated master: a replica loaded from other bits is caught at the next check") {
  // A trainable copy is rewritten from the master at every step, so a flip there heals; the master
  // persists, and at stage 0 every rank holds all of it: its difference shows in the copies.
  for (const std::string& e : run_imported(3, 0, false, 1)) {
    CAPTURE(e);
    CHECK(e.find("replicas disagree after step 1 in the data-parallel group: parameter 'w' on rank 1 differs from "
                 "ranks 0, 2") != std::string::npos);
    CHECK(e.find("parameter 'b' on rank 1 differs from ranks 0, 2") != std::string::npos);
  }
}

TEST_CASE("stage 3 with hybrid sharding: replicas of a shard that differ are named, with no majority of 2") {
  // Shard groups {0, 1}, {2, 3}; replica groups {0, 2}, {1, 3}: rank 3's shard differs from rank 1's.
  const auto errors = run_imported(4, 3, true, 3);
  // The pair that disagrees names itself; ranks 0 and 2 agree with each other but stop too, with the
  // same words (through their shard groups).
  for (const std::string& e : errors) {
    CAPTURE(e);
    CHECK(e.find("replicas disagree after step 1 in the replica group: the shard of 'w' [48, 70) differs with no "
                 "majority: ") != std::string::npos);
    CHECK(e.find("differs with no majority: rank 1 CRC32C ") != std::string::npos);
    CHECK(e.find("rank 3 CRC32C ") != std::string::npos);
  }
}

// Each rank's error from `steps` steps of a stage 3 engine on 3 ranks checked every 2 steps, with
// the fault plan `plan` armed.
std::vector<std::string> run_with_fault(const std::string& plan, int steps) {
  fault::arm(fault::parse_plan(plan));
  std::vector<std::string> errors(3);
  std::mutex mu;
  testing::run_thread_ranks(3, [&](comm::Communicator& c) {
    Model m;
    auto e = engine(EngineComms{&c}, m, options(3, 2));
    try {
      for (int s = 0; s < steps; ++s) step(*e, c.rank(), s);
    } catch (const Error& err) {
      std::lock_guard<std::mutex> lock(mu);
      errors[static_cast<size_t>(c.rank())] = err.what();
    }
  });
  fault::disarm();
  return errors;
}

TEST_CASE("stage 3 without replicas: a bit flipped in a rank's shard between steps 1 and 2 is caught at step 2") {
  // Checked every 2 steps: the shard's checksums are recorded at the end of step 1, and the flip
  // (the second rank to arrive at the point, after the record) is found as step 2's update begins.
  const std::vector<std::string> errors = run_with_fault("shard_at_rest:flip:2", 2);
  for (const std::string& e : errors) {
    CAPTURE(e);
    CHECK(e == errors[0]);  // one verdict
    CHECK(e.find("the shard of '") == 0);
    CHECK(e.find(" changed at rest between step 1 and step 2 (CRC32C ") != std::string::npos);
    CHECK(e.find("its memory was corrupted") != std::string::npos);
  }
  // Without the flip, the same run passes its check.
  testing::run_thread_ranks(3, [&](comm::Communicator& c) {
    Model m;
    auto e = engine(EngineComms{&c}, m, options(3, 2));
    for (int s = 0; s < 4; ++s) step(*e, c.rank(), s);
  });
}

TEST_CASE("stage 3: a bit flipped in one rank's gathered copy of a unit in step 2's forward is caught at step 2") {
  // Each step's forward gathers units 0 and 1 on 3 ranks: the point's 8th arrival is in step 2's
  // forward, on whichever rank gets there; the check after step 2 names that rank and the unit.
  const std::vector<std::string> errors = run_with_fault("gathered:flip:8", 2);
  for (const std::string& e : errors) {
    CAPTURE(e);
    CHECK(e == errors[0]);  // one verdict
    CHECK(e.find("replicas disagree after step 2 in the data-parallel group: unit ") != std::string::npos);
    CHECK(e.find("'s parameters as gathered for the forward (bucket ") != std::string::npos);
    CHECK(e.find(" differs from ranks ") != std::string::npos);
  }
}

}  // namespace
}  // namespace zero
