// The README's main job: the example trains, its loss decreases, and in deterministic mode the loss
// curve is identical at stages 0, 1, 2 and 3, and with the optimizer (and parameters) offloaded. Also the memory benchmark's formula check at N = 2 and 4.
// A --config file (DeepSpeed's or ours) trains as the same flags do, and hybrid sharding from a shard group size as plain sharding.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "testing/launch.h"

namespace zero {
namespace {

std::vector<std::string> loss_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t p = line.find("] step ");
    if (p != std::string::npos) lines.push_back(line.substr(p + 2));
  }
  return lines;
}

double loss_of(const std::string& line) {
  const size_t p = line.find("loss ");
  REQUIRE(p != std::string::npos);
  return std::stod(line.substr(p + 5));
}

}  // namespace

TEST_CASE("example: loss decreases and is identical across stages and offload in deterministic mode") {
  std::vector<std::string> first;
  const std::vector<std::vector<std::string>> configs{{"--stage", "0"}, {"--stage", "1"}, {"--stage", "2"},
                                                      {"--stage", "3"}, {"--stage", "1", "--offload"},
                                                      {"--stage", "3", "--offload-params"}};
  for (const auto& config : configs) {
    CAPTURE(config.back());
    std::vector<std::string> args{"--steps", "30", "--deterministic", "--lr", "0.01", "--hidden", "64",
                                  "--bucket-kib", "16"};
    args.insert(args.end(), config.begin(), config.end());
    const auto r = testing::launch(2, "examples/train_mlp", args);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const auto lines = loss_lines(r.output);
    REQUIRE(lines.size() == 30);
    double head = 0, tail = 0;  // mean of the first and the last five steps
    for (int i = 0; i < 5; ++i) {
      head += loss_of(lines[static_cast<size_t>(i)]) / 5;
      tail += loss_of(lines[lines.size() - 1 - static_cast<size_t>(i)]) / 5;
    }
    CHECK(tail < 0.8 * head);
    CHECK(r.output.find("measured/predicted") != std::string::npos);
    if (first.empty()) {
      first = lines;
    } else {
      CHECK(lines == first);
    }
  }
}

TEST_CASE("example: --config (a DeepSpeed file, with or without its accumulation steps, our format) trains as the same "
          "flags do; flags override the file") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "example_test_config";
  std::filesystem::create_directories(dir);
  const std::string deepspeed = (dir / "ds_config.json").string(), ours = (dir / "ours.json").string();
  // 32 samples per rank and micro-step on 2 ranks: the example's default --batch 64.
  std::ofstream(deepspeed) << R"({
    "train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 4096, "sub_group_size": 1e9}})";
  // The same as DeepSpeed users often write it: the global batch and the micro batch, the
  // accumulation steps left to the world (128 / (32 x 2 ranks) = 2).
  const std::string inferred = (dir / "ds_inferred.json").string();
  std::ofstream(inferred) << R"({
    "train_batch_size": 128, "train_micro_batch_size_per_gpu": 32, "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 4096}})";
  // Its lr is overridden by --lr below; global batch 128 over 2 micro-steps: 64 per micro-step.
  std::ofstream(ours) << R"({"stage": 3, "optimizer": {"groups": [{"lr": 0.5, "weight_decay": 0.01}, {"lr": 0.5}]},
    "max_grad_norm": 0.5, "micro_batches": 2, "deterministic": true,
    "layout": {"bucket_numel": 4096}, "loop": {"global_batch_size": 128}})";
  const std::vector<std::string> common{"--steps", "20", "--hidden", "64"};
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), common.begin(), common.end());
    const auto r = testing::launch(2, "examples/train_mlp", args);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return r;
  };
  const auto flags = run({"--deterministic", "--stage", "3", "--micro-steps", "2", "--max-grad-norm", "0.5",
                          "--lr", "0.02", "--bucket-kib", "16"});
  const auto from_deepspeed = run({"--config", deepspeed, "--deterministic"});
  const auto from_ours = run({"--config", ours, "--lr", "0.02"});
  const auto from_inferred = run({"--config", inferred, "--deterministic"});
  const auto lines = loss_lines(flags.output);
  REQUIRE(lines.size() == 20);
  CHECK(loss_of(lines.back()) < 0.8 * loss_of(lines.front()));
  CHECK(loss_lines(from_deepspeed.output) == lines);
  CHECK(loss_lines(from_ours.output) == lines);
  CHECK(loss_lines(from_inferred.output) == lines);
  CHECK(from_inferred.output.find("gradient_accumulation_steps: not given") != std::string::npos);
  CHECK(from_deepspeed.output.find("config: " + deepspeed + " (deepspeed)") != std::string::npos);
  CHECK(from_deepspeed.output.find("zero_optimization.sub_group_size: no effect") != std::string::npos);
  CHECK(from_ours.output.find("config: " + ours + " (ours)") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("memory per rank within 5% of the ZeRO formulas, N = 2 and 4, with and without optimizer and parameter offload") {
  for (const char* n : {"2", "4"}) {
    for (const char* stage : {"0", "1", "2", "3"}) {
      for (bool offload : {false, true}) {
        CAPTURE(n);
        CAPTURE(stage);
        CAPTURE(offload);
        std::vector<std::string> args{"--stage", stage, "--params-m", "2", "--tensors", "8",
                                      "--bucket-m", "1", "--tolerance", "0.05"};
        if (offload) args.push_back("--offload");
        const auto r = testing::launch(std::stoi(n), "examples/memory_bench", args);
        INFO(r.output);
        CHECK(r.exit_code == 0);
        CHECK(r.output.find("measured/predicted") != std::string::npos);
        // Offloaded, the host tier is compared on its own line.
        CHECK((r.output.find("host formula") != std::string::npos) == offload);
      }
    }
    const auto r = testing::launch(std::stoi(n), "examples/memory_bench",
                                   {"--stage", "3", "--params-m", "2", "--tensors", "8", "--bucket-m", "1",
                                    "--tolerance", "0.05", "--offload-params"});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("2Ψ/N; host 2Ψ/N + 12Ψ/N") != std::string::npos);
  }
}

TEST_CASE("example: hybrid sharding (2 shard groups of 2 ranks) trains as plain stage 3 at 4 ranks, from the flag and from mics_shard_size") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "example_test_hybrid";
  std::filesystem::create_directories(dir);
  // A DeepSpeed file brings DeepSpeed's defaults, so the file with mics_shard_size is compared with
  // the same file without it.
  const std::string ds_plain = (dir / "ds_plain.json").string(), ds_mics = (dir / "ds_mics.json").string();
  std::ofstream(ds_plain) << R"({"zero_optimization": {"stage": 3}})";
  std::ofstream(ds_mics) << R"({"zero_optimization": {"stage": 3, "mics_shard_size": 2}})";
  const std::vector<std::string> common{"--steps", "10", "--deterministic", "--lr", "0.01", "--hidden", "64",
                                        "--bucket-kib", "16", "--stage", "3"};
  auto run = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = testing::launch(4, "examples/train_mlp", args);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return r;
  };
  const auto plain = run({});
  const auto flag = run({"--shard-group-size", "2"});
  const auto file_plain = run({"--config", ds_plain});
  const auto file_mics = run({"--config", ds_mics});
  const auto lines = loss_lines(plain.output), file_lines = loss_lines(file_plain.output);
  REQUIRE(lines.size() == 10);
  REQUIRE(file_lines.size() == 10);
  CHECK(loss_lines(flag.output) == lines);
  CHECK(loss_lines(file_mics.output) == file_lines);
  CHECK(plain.output.find("hybrid sharding") == std::string::npos);
  CHECK(file_plain.output.find("hybrid sharding") == std::string::npos);
  CHECK(flag.output.find("hybrid sharding: 2 shard groups of 2 ranks") != std::string::npos);
  CHECK(file_mics.output.find("hybrid sharding: 2 shard groups of 2 ranks") != std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace zero
