// Checkpoints in the nodes' own directories with copies on the next node (ranks as threads, each
// "node" a directory of its own): who copies to whom, what each node holds after a save, and the
// restore after losing a node, which brings each node's directory up to the whole checkpoint and
// loads the weights of the save bit for bit; a save lost with its buddy is passed over, by name.
#include "zero/checkpoint/node_copies.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "testing/thread_ranks.h"
#include "zero/checkpoint/checkpoint_manifest.h"
#include "zero/engine.h"

namespace zero {
namespace {

namespace fs = std::filesystem;
constexpr std::chrono::seconds kTimeout{30};

std::string tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string node_dir(const std::string& base, int node) { return base + "/node-" + std::to_string(node); }

// An engine of two tensors over `c`, `steps` steps of synthetic gradients taken.
std::unique_ptr<Engine> trained(comm::Communicator& c, std::vector<std::vector<float>>& values, int stage, int steps) {
  values = {std::vector<float>(70, 0.5f), std::vector<float>(9, -0.25f)};
  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
  opt.layout = {.alignment = 4, .bucket_numel = 32, .block = 16};
  opt.timeout = kTimeout;
  auto e = std::make_unique<Engine>(c, opt);
  for (size_t t = 0; t < values.size(); ++t) {
    e->add_param({.name = "t" + std::to_string(t), .shape = {static_cast<int64_t>(values[t].size())},
                  .dtype = DType::kFloat32, .data = {values[t].data(), values[t].size()}, .unit = static_cast<int>(t)});
  }
  e->finalize();
  for (int s = 0; s < steps; ++s) {
    for (size_t t = 0; t < values.size(); ++t) {
      auto scope = e->gather_for_backward(static_cast<int>(t));
      float* g = scope.grad_as<float>(static_cast<int>(t));
      for (size_t i = 0; i < values[t].size(); ++i) g[i] += 0.01f * static_cast<float>((i + 1) * (s + 1 + c.rank()));
    }
    e->step();
  }
  return e;
}

// `nodes.size()` ranks, rank r on node nodes[r], train 3 steps at stage 2 and save with node copies
// into base/node-<n>; the weights at the save exported to `reference`. Training goes on for a step
// while the copies travel.
void save_on_nodes(const std::vector<int>& nodes, const std::string& base, const std::string& reference) {
  fs::remove_all(base);
  testing::run_thread_ranks(static_cast<int>(nodes.size()), [&](comm::Communicator& c) {
    std::vector<std::vector<float>> values;
    auto e = trained(c, values, 2, 3);
    e->export_safetensors(reference);
    std::unique_ptr<comm::Communicator> for_copies = c.split(0, c.rank());
    const NodeCopies copies{.comm = for_copies.get(), .node_of_rank = gather_nodes(c, nodes[c.rank()], kTimeout)};
    CHECK(copies.node_of_rank == nodes);
    e->save_async(node_dir(base, nodes[c.rank()]), "blob " + std::to_string(c.rank()), &copies);
    auto scope = e->gather_for_backward(1);
    scope.grad_as<float>(1)[0] = 1.0f;
    scope.close();
    e->step();
    e->wait_for_save();
  });
}

// `nodes.size()` ranks restore from base/node-<n> and load; each exports to `out`. Returns the step.
std::optional<int64_t> restore_on_nodes(const std::vector<int>& nodes, const std::string& base, const std::string& out,
                                        std::vector<std::string>* why = nullptr) {
  std::optional<int64_t> step;
  std::mutex mu;
  testing::run_thread_ranks(static_cast<int>(nodes.size()), [&](comm::Communicator& c) {
    std::vector<std::string> notes;
    const std::optional<FoundCheckpoint> found =
        restore_node_copies(c, nodes, node_dir(base, nodes[c.rank()]), kTimeout, &notes);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (c.rank() == 0 && why != nullptr) *why = notes;
      if (found) step = found->step;
    }
    if (!found) return;
    CHECK(found->dir == node_dir(base, nodes[c.rank()]));
    std::vector<std::vector<float>> values;
    auto e = trained(c, values, 3, 0);
    const LoadedCheckpoint loaded = e->load(found->dir);
    CHECK(loaded.state.step == 3);
    e->export_safetensors(out);
  });
  return step;
}

bool holds(const std::string& dir, int rank) { return fs::exists(dir + "/" + checkpoint_rank_file(rank, "bin")); }

}  // namespace

TEST_CASE("the buddy is the rank at the same place on the next node; each node's first rank completes it") {
  CHECK(buddy_of({0, 0, 1, 1}, 0) == 2);
  CHECK(buddy_of({0, 0, 1, 1}, 1) == 3);
  CHECK(buddy_of({0, 0, 1, 1}, 2) == 0);
  CHECK(buddy_of({0, 0, 1, 1}, 3) == 1);
  // Nodes of different sizes (after a restart), ids in any order: the next node is the one whose
  // first rank comes next.
  CHECK(buddy_of({5, 5, 5, 2}, 0) == 3);
  CHECK(buddy_of({5, 5, 5, 2}, 2) == 3);
  CHECK(buddy_of({5, 5, 5, 2}, 3) == 0);
  CHECK(buddy_of({0, 1, 2}, 2) == 0);
  CHECK(buddy_of({4, 4}, 1) == -1);  // one node: no copies
  CHECK(node_leader({5, 5, 5, 2}, 2) == 0);
  CHECK(node_leader({5, 5, 5, 2}, 3) == 3);
}

TEST_CASE("two nodes of two ranks: each node holds the whole save; one node left restores from its own") {
  const std::string base = tmp("node_copies_two"), ref = base + "_ref.safetensors", out = base + "_out.safetensors";
  save_on_nodes({0, 0, 1, 1}, base, ref);
  for (int node : {0, 1}) {
    for (int r = 0; r < 4; ++r) CHECK(holds(node_dir(base, node), r));
    CHECK(fs::exists(node_dir(base, node) + "/manifest.json"));
  }
  CHECK(slurp(node_dir(base, 0) + "/manifest.json") == slurp(node_dir(base, 1) + "/manifest.json"));
  fs::remove_all(node_dir(base, 1));  // node 1 lost with its memory
  CHECK(restore_on_nodes({0, 0}, base, out) == 3);
  CHECK(slurp(out) == slurp(ref));
}

TEST_CASE("three nodes: a node lost, the others fetch what they lack; a new node gets the whole save") {
  const std::string base = tmp("node_copies_three"), ref = base + "_ref.safetensors", out = base + "_out.safetensors";
  save_on_nodes({0, 1, 2}, base, ref);
  // Each node: its rank's data file and the previous node's.
  CHECK((holds(node_dir(base, 0), 0) && holds(node_dir(base, 0), 2) && !holds(node_dir(base, 0), 1)));
  CHECK((holds(node_dir(base, 1), 1) && holds(node_dir(base, 1), 0) && !holds(node_dir(base, 1), 2)));
  fs::remove_all(node_dir(base, 2));
  CHECK(restore_on_nodes({0, 1}, base, out) == 3);
  CHECK(slurp(out) == slurp(ref));
  for (int r = 0; r < 3; ++r) CHECK((holds(node_dir(base, 0), r) && holds(node_dir(base, 1), r)));

  // A node that held nothing (a replacement) joins: it gets the manifest, the indexes and the data.
  fs::remove_all(out);
  CHECK(restore_on_nodes({0, 3}, base, out) == 3);
  CHECK(slurp(out) == slurp(ref));
  CHECK(fs::exists(node_dir(base, 3) + "/manifest.json"));
}

TEST_CASE("a node and its buddy node lost: the save is passed over, naming the rank whose data is gone") {
  const std::string base = tmp("node_copies_lost"), ref = base + "_ref.safetensors";
  save_on_nodes({0, 1, 2}, base, ref);
  // Rank 1's file was on node 1 and its copy on node 2.
  fs::remove_all(node_dir(base, 1));
  fs::remove_all(node_dir(base, 2));
  std::vector<std::string> why;
  CHECK_FALSE(restore_on_nodes({0}, base, base + "_out.safetensors", &why).has_value());
  REQUIRE(why.size() == 1);
  CAPTURE(why[0]);
  CHECK(why[0].find("the save of step 3") != std::string::npos);
  CHECK(why[0].find("no node holds rank 1's data file") != std::string::npos);
}

TEST_CASE("node copies that are not the engine's ranks are refused by name") {
  const std::string base = tmp("node_copies_refused");
  std::vector<std::string> errors;
  testing::thread_rank_results<int>(2, [&](comm::Communicator& c) {
    std::vector<std::vector<float>> values;
    auto e = trained(c, values, 1, 1);
    const NodeCopies copies{.comm = &c, .node_of_rank = {0, 1, 1}};
    e->save_async(node_dir(base, c.rank()), {}, &copies);
    return 0;
  }, errors);
  REQUIRE(errors.size() == 2);
  CHECK(errors[0].find("NodeCopies: its communicator is rank") != std::string::npos);
  CHECK(errors[0].find("with 3 nodes listed, but the engine is rank") != std::string::npos);
}

}  // namespace zero
