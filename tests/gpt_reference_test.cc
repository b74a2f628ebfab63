// The GPT example's model trained by the engine follows PyTorch's data-parallel run at every stage,
// at the reference's 2 ranks and on 1 rank with 2 micro-steps, with and without optimizer offload;
// and split over tensor-parallel ranks: gpt_4layer_dp2 at tp 2 and 4 with dp 1 and 2, stages 0-3,
// with and without sequence parallelism, and with offload at stage 3; and split into pipeline
// stages: gpt_4layer_dp2 at pp 2 and 4, each with dp 1 and 2, under every schedule (interleaved
// and zb-v with 2 chunks at pp 2, zb-v at every stage), stages 0-3 and stage 3 with offload, uneven
// stages, every schedule giving bitwise the same losses, norms and parameters at a fixed (dp, pp);
// and in 3D, dp 2 x tp 2 x pp 2.
// Muon + AdamW and Adafactor follow their own references at stages 0-3, offloaded and under tp.
// The layout x stage x schedule matrices run whole with ZERO_FULL_MATRIX=1 (scripts/full_matrix.sh);
// by default a subset in which every layout, stage, schedule and flag still appears (testing/matrix.h).
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "testing/launch.h"
#include "testing/matrix.h"

namespace zero {

TEST_CASE("GPT training follows PyTorch at stages 0-3") {
  const std::string file = "tests/data/pytorch/gpt/gpt_tiny_dp2.json";
  for (const char* stage : {"0", "1", "2", "3"}) {
    for (int nproc : {2, 1}) {
      CAPTURE(stage);
      CAPTURE(nproc);
      const auto r = testing::launch(nproc, "tests/gpt_reference_worker", {"--file", file, "--stage", stage});
      INFO(r.output);
      CHECK(r.exit_code == 0);
      CHECK(r.output.find("check and 3 steps match PyTorch") != std::string::npos);
    }
  }
  const auto r = testing::launch(2, "tests/gpt_reference_worker", {"--file", file, "--stage", "3", "--offload"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
}

TEST_CASE("GPT training split over tensor-parallel ranks follows PyTorch") {
  const std::string file = "tests/data/pytorch/gpt/gpt_4layer_dp2.json";
  struct Layout {
    int dp, tp;
  };
  const Layout layouts[] = {Layout{1, 2}, Layout{2, 2}, Layout{1, 4}, Layout{2, 4}};
  for (int li = 0; li < 4; ++li) {
    const Layout l = layouts[li];
    for (int si = 0; si < 4; ++si) {
      const std::string stage = std::to_string(si);
      for (bool sp : {false, true}) {
        // The covering subset: every (stage, sequence parallelism) pair once, each layout with and
        // without sequence parallelism.
        if (!testing::full_matrix() && (si + 2 * sp) % 4 != li) continue;
        CAPTURE(l.dp);
        CAPTURE(l.tp);
        CAPTURE(stage);
        CAPTURE(sp);
        std::vector<std::string> args = {"--file", file, "--stage", stage, "--tp", std::to_string(l.tp)};
        if (sp) args.push_back("--sequence-parallel");
        const auto r = testing::launch(l.dp * l.tp, "tests/gpt_reference_worker", args);
        INFO(r.output);
        CHECK(r.exit_code == 0);
        CHECK(r.output.find("check and 3 steps match PyTorch") != std::string::npos);
      }
    }
  }
  // The 2-head file where its sizes allow: tp 2.
  for (const char* stage : {"1", "3"}) {
    const auto r = testing::launch(2, "tests/gpt_reference_worker",
                                   {"--file", "tests/data/pytorch/gpt/gpt_tiny_dp2.json", "--stage", stage, "--tp", "2",
                                    "--sequence-parallel"});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("check and 3 steps match PyTorch") != std::string::npos);
  }
  for (bool sp : {false, true}) {
    std::vector<std::string> args = {"--file", file, "--stage", "3", "--offload", "--tp", "2"};
    if (sp) args.push_back("--sequence-parallel");
    const auto r = testing::launch(4, "tests/gpt_reference_worker", args);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("dp 2 x tp 2") != std::string::npos);
  }
}

// Muon + AdamW and Adafactor (scripts/gpt_optimizer_reference.py: PyTorch from the published
// algorithms, 5 steps) on 1 and 2 ranks at stages 0-3, offloaded, and split over tensor-parallel
// ranks (dp 1 and 2 x tp 2), where Muon orthogonalizes each split matrix whole and Adafactor keeps
// the whole tensor's statistics. The covering subset: each stage once per rank count; the whole
// matrix with ZERO_FULL_MATRIX=1.
TEST_CASE("GPT training with Muon + AdamW and with Adafactor follows PyTorch, under tp too") {
  for (const char* optimizer : {"muon", "adafactor"}) {
    const std::string file = std::string("tests/data/pytorch/gpt/gpt_4layer_dp2_") + optimizer + ".json";
    struct Layout {
      int nproc;
      std::vector<std::string> args;
    };
    std::vector<Layout> runs;
    for (int si = 0; si < 4; ++si) {
      for (int nproc : {1, 2}) {
        if (!testing::full_matrix() && si % 2 != nproc - 1) continue;
        runs.push_back({nproc, {"--stage", std::to_string(si)}});
      }
    }
    runs.push_back({2, {"--stage", "2", "--offload"}});
    runs.push_back({2, {"--stage", "1", "--tp", "2"}});
    runs.push_back({4, {"--stage", "3", "--tp", "2"}});
    for (const Layout& run : runs) {
      std::vector<std::string> args = run.args;
      args.insert(args.begin(), {"--file", file});
      CAPTURE(optimizer);
      CAPTURE(run.nproc);
      std::string flags;
      for (const std::string& a : args) flags += a + " ";
      CAPTURE(flags);
      const auto r = testing::launch(run.nproc, "tests/gpt_reference_worker", args);
      INFO(r.output);
      CHECK(r.exit_code == 0);
      CHECK(r.output.find("check and 5 steps match PyTorch") != std::string::npos);
    }
  }
}

// The digest lines of every rank ("digest <what> <hash>"), as a set: the same set means bitwise the
// same losses, norms and final parameters, whichever rank held what.
std::set<std::string> digests(const std::string& output) {
  std::set<std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("digest ");
    if (at != std::string::npos) out.insert(line.substr(at));
  }
  return out;
}

const char* const k4Layer = "tests/data/pytorch/gpt/gpt_4layer_dp2.json";

// One run of the worker on gpt_4layer_dp2 that must match PyTorch; its digest lines.
std::set<std::string> run_matching(int nproc, std::vector<std::string> args) {
  args.insert(args.begin(), {"--file", k4Layer, "--print-digest"});
  const auto r = testing::launch(nproc, "tests/gpt_reference_worker", args);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("check and 3 steps match PyTorch") != std::string::npos);
  return digests(r.output);
}

// Runs that must all give the first one's digests (bitwise the same losses, norms and parameters).
class SameBits {
 public:
  void check(const std::set<std::string>& d) {
    CHECK(d.size() > 20);  // the losses and every parameter
    if (first_.empty()) {
      first_ = d;
    } else {
      CHECK(d == first_);
    }
  }

 private:
  std::set<std::string> first_;
};

struct Run {
  int nproc;
  std::vector<std::string> args;
};

TEST_CASE("GPT training split into pipeline stages follows PyTorch, bitwise the same under every schedule") {
  struct Layout {
    int dp, pp, micro_batches;
  };
  const Layout layouts[] = {Layout{1, 2, 4}, Layout{2, 2, 2}, Layout{1, 4, 4}, Layout{2, 4, 4}};
  for (int li = 0; li < 4; ++li) {
    const Layout l = layouts[li];
    for (int si = 0; si < 4; ++si) {
      // The covering subset: each layout at one stage (every stage once), under every schedule.
      if (!testing::full_matrix() && si != li) continue;
      const std::string stage = std::to_string(si);
      SameBits same;
      for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"}) {
        const bool interleaved = std::string(schedule) == "interleaved";
        // 4 layers: 2 chunks per rank (interleaved, zb-v's V) at pp 2 only.
        if ((interleaved || std::string(schedule) == "zb-v") && l.pp != 2) continue;
        CAPTURE(l.dp);
        CAPTURE(l.pp);
        CAPTURE(stage);
        CAPTURE(schedule);
        std::vector<std::string> args = {"--stage", stage, "--pp", std::to_string(l.pp), "--pp-schedule", schedule,
                                         "--micro-batches", std::to_string(l.micro_batches)};
        if (interleaved) args.insert(args.end(), {"--chunks", "2"});
        same.check(run_matching(l.dp * l.pp, args));
      }
    }
  }
  // Stage 3 with offload; every micro-batch reduced into the shard; uneven stages (one holding only
  // the embedding, one only the head).
  for (const Run& run : {Run{2, {"--stage", "3", "--offload", "--pp", "2", "--pp-schedule", "zb-h1", "--micro-batches", "4"}},
                         Run{4, {"--stage", "3", "--offload", "--pp", "2", "--micro-batches", "2"}},
                         Run{4, {"--stage", "2", "--pp", "2", "--micro-batches", "4", "--reduce-each-micro-batch"}},
                         Run{4, {"--stage", "3", "--pp", "2", "--pp-schedule", "zb-h1", "--micro-batches", "4",
                                 "--reduce-each-micro-batch"}},
                         Run{2, {"--stage", "2", "--pp", "2", "--pp-schedule", "interleaved", "--chunks", "2",
                                 "--micro-batches", "4", "--reduce-each-micro-batch"}},
                         Run{4, {"--stage", "2", "--pp", "4", "--pp-layers", "0,2,2,0", "--micro-batches", "4"}}}) {
    run_matching(run.nproc, run.args);
  }
}

// ZB-V: rank 0 holds the first and the last chunk (the embedding and the head share one wte),
// rank 1 hands its chunk 0's output to its own chunk 1; at every stage the same bits as 1F1B.
TEST_CASE("GPT training under zb-v follows PyTorch at stages 0-3, bitwise the same as 1F1B") {
  for (const char* stage : {"0", "1", "2", "3"}) {
    SameBits same;
    for (const char* schedule : {"1f1b", "zb-v"}) {
      CAPTURE(stage);
      CAPTURE(schedule);
      same.check(run_matching(2, {"--stage", stage, "--pp", "2", "--pp-schedule", schedule, "--micro-batches", "4"}));
    }
  }
  for (const Run& run : {Run{2, {"--stage", "3", "--offload", "--pp", "2", "--pp-schedule", "zb-v", "--micro-batches", "4"}},
                         Run{8, {"--stage", "3", "--tp", "2", "--pp", "2", "--pp-schedule", "zb-v", "--micro-batches", "2"}},
                         Run{2, {"--stage", "2", "--pp", "2", "--pp-schedule", "zb-v", "--micro-batches", "4",
                                 "--reduce-each-micro-batch"}}}) {
    run_matching(run.nproc, run.args);
  }
}

TEST_CASE("3D: dp 2 x tp 2 x pp 2 follows PyTorch, bitwise the same under 1F1B and ZB-H1 at every stage") {
  SameBits same;
  for (const char* stage : {"0", "1", "2", "3"}) {
    // The covering subset: stages 1 and 3 (stages 0 and 2 run at dp x pp and dp x tp above).
    if (!testing::full_matrix() && (std::string(stage) == "0" || std::string(stage) == "2")) continue;
    for (const char* schedule : {"1f1b", "zb-h1"}) {
      CAPTURE(stage);
      CAPTURE(schedule);
      const std::set<std::string> d = run_matching(8, {"--stage", stage, "--tp", "2", "--pp", "2", "--pp-schedule", schedule,
                                                       "--micro-batches", "2"});
      // tp rank 1's parts among the digests: the ranks did split the model over tp.
      CHECK(std::any_of(d.begin(), d.end(), [](const std::string& x) { return x.find(" tp1 ") != std::string::npos; }));
      same.check(d);
    }
  }
  // Stage 3 with offload; sequence parallelism; a first stage holding only the embedding (its norm
  // share is wte's alone, counted once with the head's copy); the mesh laid out tp slowest.
  for (const Run& run : {Run{8, {"--stage", "3", "--offload", "--tp", "2", "--pp", "2", "--micro-batches", "2"}},
                         Run{8, {"--stage", "3", "--tp", "2", "--sequence-parallel", "--pp", "2", "--micro-batches", "2"}},
                         Run{4, {"--stage", "2", "--tp", "2", "--pp", "2", "--pp-layers", "0,4", "--micro-batches", "4"}},
                         Run{8, {"--stage", "2", "--tp", "2", "--pp", "2", "--micro-batches", "2", "--mesh-order", "tp,dp,pp"}}}) {
    run_matching(run.nproc, run.args);
  }
}

TEST_CASE("pipeline flags that do not fit fail naming the flag") {
  const std::string file = k4Layer;
  struct Case {
    int nproc;
    std::vector<std::string> args;
    const char* error;
  };
  for (const Case& c : {Case{2, {"--pp", "2", "--pp-layers", "2,1"}, "--pp-layers sums to 3 layers but the model has n_layer 4"},
                        Case{2, {"--pp", "2", "--pp-layers", "2,x"}, "'x' is not a layer count"},
                        Case{2, {"--pp", "2", "--pp-schedule", "pipedream"}, "pipedream"},
                        Case{2, {"--pp", "2", "--chunks", "2"}, "'1f1b' runs one chunk per rank: 2 chunks need 'interleaved'"},
                        Case{2, {"--pp", "2", "--pp-schedule", "zb-v", "--chunks", "3"}, "'zb-v' runs 2 chunks per rank in a V, not 3"},
                        // 4 layers in a V of 8 chunks: the chunks past the layers would hold nothing.
                        Case{4, {"--pp", "4", "--pp-schedule", "zb-v", "--micro-batches", "4"},
                             "layers [4, 4) hold no block, and the stage is neither the first nor the last"},
                        Case{2, {"--pp", "2", "--micro-batches", "3"}, "--micro-batches 3 is not a multiple"},
                        Case{3, {"--pp", "2"}, "--tp 1 x --pp 2 does not divide the 3 ranks"}}) {
    std::vector<std::string> args = {"--file", file};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const auto r = testing::launch(c.nproc, "tests/gpt_reference_worker", args);
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK(r.output.find(c.error) != std::string::npos);
  }
}

TEST_CASE("a reference whose heads tp does not divide fails naming both") {
  // gpt_tiny_dp2 has 2 heads.
  const auto r = testing::launch(4, "tests/gpt_reference_worker",
                                 {"--file", "tests/data/pytorch/gpt/gpt_tiny_dp2.json", "--tp", "4"});
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("n_head 2 does not divide by tp 4") != std::string::npos);
  const auto s = testing::launch(1, "tests/gpt_reference_worker",
                                 {"--file", "tests/data/pytorch/gpt/gpt_tiny_dp2.json", "--sequence-parallel"});
  INFO(s.output);
  CHECK(s.exit_code != 0);
  CHECK(s.output.find("--sequence-parallel needs --tp above 1") != std::string::npos);
}

}  // namespace zero
