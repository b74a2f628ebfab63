// Checkpoints that move between (dp, tp, pp, stage, offload) layouts with no offline step: the GPT
// example saved at one layout resumes at another, and the continued run follows the uninterrupted
// single-rank run within ../shared/testdata/README.md's tolerances (losses 1e-5 relative, parameters
// 2e-4 absolute, compared through each run's export in GPT-2's layout). A checkpoint of another model
// fails on every rank naming the parameter.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "testing/fp32_export.h"
#include "testing/launch.h"
#include "testing/metrics.h"

namespace zero {
namespace {

std::string tmp_dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/gpt_3d_ckpt";
}

// Where train() has the run's metrics written (progress_log.h), and the losses read back from it.
std::string metrics_path() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/gpt_3d_ckpt_metrics.jsonl";
}
std::vector<double> losses() { return testing::metric(metrics_path(), "loss"); }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

using testing::Fp32Export;
using testing::read_fp32_export;

// A layout: ranks and flags.
struct Layout {
  int nproc;
  std::vector<std::string> flags;
  std::string name() const {
    std::string s = std::to_string(nproc) + " ranks";
    for (const std::string& f : flags) s += " " + f;
    return s;
  }
};

// Deterministic, a constant learning rate (so a run of 4 steps is the first 4 of a run of 6), every
// step's loss in the metrics file.
testing::LaunchResult train(const Layout& l, std::vector<std::string> extra) {
  std::vector<std::string> args{"--n-layer", "4", "--deterministic", "--val-every", "0", "--sample-tokens", "0",
                                "--log-every", "1", "--warmup", "0", "--min-lr-ratio", "1", "--batch", "16",
                                "--metrics", metrics_path()};
  args.insert(args.end(), l.flags.begin(), l.flags.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return testing::launch(l.nproc, "examples/gpt/train_gpt", args);
}

void check_losses(const std::vector<double>& got, const std::vector<double>& want, size_t from) {
  REQUIRE(got.size() + from <= want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(from + i + 1);
    CHECK(std::abs(got[i] - want[from + i]) <= 1e-5 * std::abs(want[from + i]));
  }
}

}  // namespace

TEST_CASE("a checkpoint saved at one (dp, tp, pp, stage, offload) resumes at another and follows the single-rank run") {
  const std::string dir = tmp_dir();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // The uninterrupted run on one rank, and its export.
  const auto whole = train({1, {}}, {"--steps", "6", "--export", dir + "/whole.safetensors"});
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  const std::vector<double> want = losses();
  REQUIRE(want.size() == 6);
  const Fp32Export reference = read_fp32_export(dir + "/whole.safetensors");
  struct Move {
    Layout from, to;
    std::string saved_at;  // as the resume and zero_ckpt inspect report it
  };
  const std::vector<Move> moves = {
      {{8, {"--tp", "2", "--pp", "2", "--stage", "3"}}, {8, {"--stage", "1"}}, "dp 2 x tp 2 x pp 2, stage 3, 1f1b x 4"},
      {{8, {"--stage", "2"}}, {8, {"--tp", "2", "--pp", "4", "--stage", "3"}}, "dp 8 x tp 1 x pp 1, stage 2"},
      // The whole layout goes in the manifest, the text form's flags as the others.
      {{8, {"--layout", "tp=2,pp=2,stage=2,offload,micro_batches=2,schedule=gpipe,recompute"}},
       {8, {"--tp", "2", "--stage", "0"}},
       "dp 2 x tp 2 x pp 2, stage 2, gpipe x 2, offload, recompute"},
      {{1, {}}, {8, {"--tp", "2", "--pp", "2", "--stage", "3", "--pp-schedule", "zb-h1"}}, "dp 1 x tp 1 x pp 1, stage 3"},
      // A V (rank 0 holds the embedding and the head, one wte) out of and into loop layouts.
      {{4, {"--pp", "2", "--stage", "3", "--pp-schedule", "zb-v"}},
       {8, {"--tp", "2", "--pp", "2", "--stage", "2"}},
       "dp 2 x tp 1 x pp 2, stage 3, zb-v x 4, 2 chunks"},
      {{8, {"--tp", "2", "--pp", "2", "--stage", "1"}},
       {4, {"--pp", "2", "--stage", "2", "--pp-schedule", "zb-v"}},
       "dp 2 x tp 2 x pp 2, stage 1, 1f1b x 4"},
  };
  for (size_t k = 0; k < moves.size(); ++k) {
    const Move& m = moves[k];
    CAPTURE(m.from.name());
    CAPTURE(m.to.name());
    const std::string ckpt = dir + "/ckpt" + std::to_string(k), out = dir + "/moved" + std::to_string(k) + ".safetensors";
    const std::string first_export = ckpt + "_first.safetensors";
    const auto first = train(m.from, {"--steps", "4", "--save", ckpt, "--export", first_export});
    INFO(first.output);
    REQUIRE(first.exit_code == 0);
    check_losses(losses(), want, 0);
    // Offline: zero_ckpt shows the layout, and its export of the checkpoint is the run's own export,
    // byte for byte (whole tensors put together from the tp parts of every stage).
    const auto inspect = testing::run("zero/checkpoint/zero_ckpt", {"inspect", ckpt});
    INFO(inspect.output);
    REQUIRE(inspect.exit_code == 0);
    CHECK(inspect.output.find("layout: " + m.saved_at) != std::string::npos);
    const std::string offline = ckpt + "_offline.safetensors";
    const auto exported = testing::run("zero/checkpoint/zero_ckpt", {"export", ckpt, offline});
    INFO(exported.output);
    REQUIRE(exported.exit_code == 0);
    CHECK(slurp(offline) == slurp(first_export));
    const auto second = train(m.to, {"--steps", "6", "--resume", ckpt, "--export", out});
    INFO(second.output);
    REQUIRE(second.exit_code == 0);
    CHECK(second.output.find("resumed from " + ckpt + " at step 4 (saved at " + m.saved_at + ")") != std::string::npos);
    const std::vector<double> got = losses();
    REQUIRE(got.size() == 2);
    check_losses(got, want, 4);
    // The export: GPT-2's tensors, whole, equal to the single-rank run's.
    const Fp32Export w = read_fp32_export(out);
    CHECK(w.shapes == reference.shapes);
    for (const auto& [name, values] : reference.values) {
      CAPTURE(name);
      const std::vector<float>& v = w.values.at(name);
      REQUIRE(v.size() == values.size());
      float worst = 0;
      for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::abs(v[i] - values[i]));
      CHECK(worst <= 2e-4f);
    }
  }
}

TEST_CASE("a 3D checkpoint of another model fails on every rank naming the parameter") {
  const std::string dir = tmp_dir() + "/other";
  std::filesystem::remove_all(dir);
  const Layout saved{4, {"--tp", "2", "--pp", "2"}};
  const auto first = train(saved, {"--steps", "1", "--save", dir});
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  struct Case {
    Layout at;
    std::vector<std::string> model;
    std::string error;
  };
  // Fewer layers: the saved h.2 and h.3 belong to no engine, whichever stage would have held them.
  // More layers: h.4 is missing. Narrower: another shape.
  for (const Case& c : {Case{{4, {"--tp", "2", "--pp", "2"}}, {"--n-layer", "2"}, "holds parameter 'h.2.attn.c_attn.bias'"},
                        Case{{2, {"--pp", "2"}}, {"--n-layer", "6"}, "has no parameter 'h.4."},
                        Case{{4, {"--tp", "2", "--pp", "2"}}, {"--n-layer", "4", "--n-embd", "32"}, "has shape [256, 64]"}}) {
    CAPTURE(c.at.name());
    CAPTURE(c.error);
    std::vector<std::string> extra = {"--steps", "2", "--resume", dir};
    extra.insert(extra.end(), c.model.begin(), c.model.end());
    // --n-layer comes after train()'s, so it wins.
    const auto r = train(c.at, extra);
    INFO(r.output);
    CHECK(r.exit_code != 0);
    for (int rank = 0; rank < c.at.nproc; ++rank) {
      CHECK(r.output.find("[rank " + std::to_string(rank) + "] train_gpt: ") != std::string::npos);
    }
    CHECK(r.output.find(c.error) != std::string::npos);
    CHECK(r.output.find("] step ") == std::string::npos);  // nothing trained
  }
}

}  // namespace zero
