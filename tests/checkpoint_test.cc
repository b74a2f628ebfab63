// Checkpoints across processes: resume is exact at the same world size at any stage and between N
// ranks x 1 micro-step and 1 rank x N micro-steps (both directions), and within fp32 tolerance at
// other world sizes; the export equals the gathered parameters bit for bit and follows the
// safetensors specification (read back here by a reader written from the specification alone); a
// damaged, incomplete or foreign checkpoint fails with an error naming the file.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/launch.h"

namespace zero {
namespace {

namespace fs = std::filesystem;
const std::string kWorker = "tests/checkpoint_worker";

std::string tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string run_ok(int nproc, const std::vector<std::string>& args) {
  const testing::LaunchResult r = testing::launch(nproc, kWorker, args);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return r.output;
}

// The run's final weights, as exported.
std::string exported(int nproc, std::vector<std::string> args, const std::string& name) {
  const std::string path = tmp(name + ".safetensors");
  args.insert(args.end(), {"--export", path});
  run_ok(nproc, args);
  return slurp(path);
}

// A safetensors reader from the specification: u64 little-endian header size N, N bytes of JSON,
// then the byte buffer; every entry's data_offsets index that buffer; together they cover it.
struct Tensors {
  std::map<std::string, std::vector<float>> f32;
  std::string data;  // the byte buffer
};

Tensors read_safetensors(const std::string& file) {
  REQUIRE(file.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[static_cast<size_t>(i)]);
  REQUIRE(8 + n <= file.size());
  CHECK((8 + n) % 8 == 0);  // we pad the header so the buffer starts 8-byte aligned
  const nlohmann::json header = nlohmann::json::parse(file.substr(8, n));
  Tensors t;
  t.data = file.substr(8 + n);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& e = it.value();
    REQUIRE(e["dtype"] == "F32");
    uint64_t count = 1;
    for (const auto& d : e["shape"]) count *= d.get<uint64_t>();
    const uint64_t b = e["data_offsets"][0], end = e["data_offsets"][1];
    REQUIRE(end - b == count * 4);
    std::vector<float> v(count);
    std::memcpy(v.data(), t.data.data() + b, end - b);
    t.f32[it.key()] = std::move(v);
    ranges.emplace_back(b, end);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [b, e] : ranges) {
    CHECK(b == at);  // contiguous, no holes
    at = e;
  }
  CHECK(at == t.data.size());
  return t;
}

double max_abs_diff(const Tensors& a, const Tensors& b) {
  REQUIRE(a.f32.size() == b.f32.size());
  double worst = 0;
  for (const auto& [name, v] : a.f32) {
    const auto& w = b.f32.at(name);
    REQUIRE(v.size() == w.size());
    for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(v[i]) - w[i]));
  }
  return worst;
}

}  // namespace

TEST_CASE("resume is exact at the same world size (any stage) and between N x 1 and 1 x N micro-steps") {
  const std::string full = exported(4, {"--stage", "2", "--steps", "6"}, "full4");
  const std::string dir4 = tmp("ckpt_4_stage2");
  run_ok(4, {"--stage", "2", "--steps", "3", "--save-at", "3", "--dir", dir4});
  CHECK(fs::exists(dir4 + "/manifest.json"));
  CHECK_FALSE(fs::exists(dir4 + ".partial"));
  for (const char* stage : {"0", "1", "2", "3"}) {
    CAPTURE(stage);
    CHECK(exported(4, {"--stage", stage, "--resume", dir4}, std::string("resume4_") + stage) == full);
  }
  CHECK(exported(4, {"--stage", "3", "--offload", "--resume", dir4}, "resume4_offload") == full);
  CHECK(exported(1, {"--stage", "0", "--micro", "4", "--resume", dir4}, "resume1x4") == full);
  // The reverse: saved on 1 rank x 4 micro-steps, resumed on 4 ranks.
  const std::string dir1 = tmp("ckpt_1x4_stage0");
  run_ok(1, {"--stage", "0", "--micro", "4", "--steps", "3", "--save-at", "3", "--dir", dir1});
  CHECK(exported(4, {"--stage", "2", "--resume", dir1}, "resume_from1_stage2") == full);
  CHECK(exported(4, {"--stage", "3", "--resume", dir1}, "resume_from1_stage3") == full);
  // An async save taken at step 3 while steps 4-6 train resumes the same way.
  const std::string dira = tmp("ckpt_4_async");
  CHECK(exported(4, {"--stage", "3", "--steps", "6", "--save-at", "3", "--dir", dira, "--async"}, "async_run") == full);
  CHECK(exported(2, {"--stage", "0", "--micro", "2", "--resume", dira}, "resume_async").size() == full.size());
  CHECK(exported(4, {"--stage", "1", "--resume", dira}, "resume_async4") == full);
}

TEST_CASE("resume at other world sizes and stages follows the uninterrupted run within fp32 tolerance") {
  const Tensors full = read_safetensors(exported(4, {"--stage", "2", "--steps", "6"}, "full4b"));
  const std::string dir4 = tmp("ckpt_4_stage2b");
  run_ok(4, {"--stage", "2", "--steps", "3", "--save-at", "3", "--dir", dir4});
  CHECK(max_abs_diff(read_safetensors(exported(2, {"--stage", "3", "--micro", "2", "--resume", dir4}, "r2s3")), full) <
        2e-4);
  CHECK(max_abs_diff(read_safetensors(exported(3, {"--stage", "1", "--resume", dir4}, "r3s1")), full) < 2e-4);
  // And back: saved on 2 ranks at stage 3 and on 3 ranks at stage 1, resumed on 4 at stage 2.
  const std::string dir2 = tmp("ckpt_2_stage3");
  run_ok(2, {"--stage", "3", "--micro", "2", "--steps", "3", "--save-at", "3", "--dir", dir2});
  CHECK(max_abs_diff(read_safetensors(exported(4, {"--stage", "2", "--resume", dir2}, "r4from2")), full) < 2e-4);
  const std::string dir3 = tmp("ckpt_3_stage1");
  run_ok(3, {"--stage", "1", "--steps", "3", "--save-at", "3", "--dir", dir3});
  CHECK(max_abs_diff(read_safetensors(exported(4, {"--stage", "2", "--resume", dir3}, "r4from3")), full) < 2e-4);
}

TEST_CASE("the export is the gathered parameters bit for bit, in the safetensors format") {
  for (const char* stage : {"1", "2"}) {
    CAPTURE(stage);
    const std::string dump = tmp(std::string("params_") + stage + ".bin");
    const std::string file =
        exported(2, {"--stage", stage, "--steps", "3", "--dump-params", dump}, std::string("export_") + stage);
    const Tensors t = read_safetensors(file);
    // Registration order is file order: the buffer is the parameters back to back.
    CHECK(t.data == slurp(dump));
    CHECK(t.f32.size() == 6);
  }
}

TEST_CASE("damaged, incomplete and foreign checkpoints fail, naming the file") {
  const std::string good = tmp("ckpt_good");
  run_ok(2, {"--stage", "2", "--steps", "2", "--save-at", "2", "--dir", good});
  auto copy = [&](const std::string& name) {
    const std::string d = tmp(name);
    fs::remove_all(d);
    fs::copy(good, d);
    return d;
  };
  auto fails_with = [&](const std::string& dir, const std::vector<std::string>& needles,
                        const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args{"--stage", "3", "--resume", dir};
    args.insert(args.end(), extra.begin(), extra.end());
    const testing::LaunchResult r = testing::launch(2, kWorker, args);
    INFO(r.output);
    CHECK(r.exit_code != 0);
    for (const std::string& n : needles) CHECK(r.output.find(n) != std::string::npos);
  };
  {
    const std::string d = copy("ckpt_flipped");
    std::fstream f(d + "/rank-00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    char c = 0;
    f.read(&c, 1);
    f.seekp(20);
    c = static_cast<char>(c ^ 0x40);
    f.write(&c, 1);
    f.close();
    fails_with(d, {"rank-00001.bin", "checksum mismatch"});
  }
  {
    const std::string d = copy("ckpt_truncated");
    fs::resize_file(d + "/rank-00000.bin", fs::file_size(d + "/rank-00000.bin") - 10);
    fails_with(d, {"rank-00000.bin", "truncated"});
  }
  {
    const std::string d = copy("ckpt_missing");
    fs::remove(d + "/rank-00001.bin");
    fails_with(d, {"rank-00001.bin", "missing"});
  }
  {
    const std::string d = copy("ckpt_unfinished");
    fs::remove(d + "/manifest.json");
    fails_with(d, {"ckpt_unfinished", "no manifest.json"});
  }
  fails_with(good, {"parameter 'layer0.weight'", "shape"}, {"--hidden", "12"});
  fails_with(tmp("no_such_checkpoint"), {"no_such_checkpoint", "no such directory"});
}

TEST_CASE("a second save into the same directory replaces the first only once it is complete") {
  const std::string dir = tmp("ckpt_twice");
  run_ok(2, {"--stage", "1", "--steps", "2", "--save-at", "2", "--dir", dir});
  const std::string first = slurp(dir + "/manifest.json");
  run_ok(2, {"--stage", "1", "--steps", "3", "--save-at", "3", "--dir", dir});
  CHECK(slurp(dir + "/manifest.json") != first);
  CHECK_FALSE(fs::exists(dir + ".old"));
  CHECK_FALSE(fs::exists(dir + ".partial"));
  CHECK(run_ok(2, {"--stage", "2", "--steps", "3", "--resume", dir}).find("resumed at step 3") != std::string::npos);
}

TEST_CASE("zero_ckpt inspects, verifies and exports a checkpoint offline") {
  const std::string dir = tmp("ckpt_tool");
  const std::string online = tmp("tool_online.safetensors");
  run_ok(2, {"--stage", "3", "--steps", "2", "--save-at", "2", "--dir", dir, "--export", online});
  testing::LaunchResult r = testing::run("zero/checkpoint/zero_ckpt", {"inspect", dir});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  // The step, and the layout it was saved at: 2 data-parallel ranks, no model parallelism, stage 3.
  CHECK(r.output.find("step 2, model dtype") != std::string::npos);
  CHECK(r.output.find("layout: dp 2 x tp 1 x pp 1, stage 3\n") != std::string::npos);
  CHECK(r.output.find("layer0.weight") != std::string::npos);
  r = testing::run("zero/checkpoint/zero_ckpt", {"verify", dir});
  CHECK(r.exit_code == 0);
  // The offline export has the bits of the engine's own.
  const std::string offline = tmp("tool_offline.safetensors");
  r = testing::run("zero/checkpoint/zero_ckpt", {"export", dir, offline});
  CHECK(r.exit_code == 0);
  CHECK(slurp(offline) == slurp(online));
  // A flipped byte: verify names the file.
  {
    std::fstream f(dir + "/rank-00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x55');
  }
  r = testing::run("zero/checkpoint/zero_ckpt", {"verify", dir});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("rank-00000.bin") != std::string::npos);
  CHECK(r.output.find("checksum mismatch") != std::string::npos);
}

}  // namespace zero
