// Model descriptions for the planner: a parameter count, a list of shapes, a safetensors header.
#include "zero/plan/model_spec.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "base/error.h"
#include "zero/checkpoint/safetensors.h"

namespace zero::plan {

TEST_CASE("a parameter count splits into equal tensors, one unit each, the last taking the rest") {
  const ModelSpec m = model_of_count(10, 3, DType::kBFloat16);
  REQUIRE(m.tensors.size() == 3);
  CHECK(m.tensors[0].shape == std::vector<int64_t>{3});
  CHECK(m.tensors[2].shape == std::vector<int64_t>{4});
  CHECK(m.tensors[2].unit == 2);
  CHECK(m.numel() == 10);
  CHECK_THROWS_AS(model_of_count(2, 3, DType::kBFloat16), InvalidArgument);
}

TEST_CASE("shapes: units given or taken from the names, errors naming the line") {
  const ModelSpec given = model_of_shapes("# comment\nwte 256x64 0\n\nh.0.w 64x64 1\n", DType::kFloat32, "m.txt");
  REQUIRE(given.tensors.size() == 2);
  CHECK(given.tensors[1].unit == 1);
  const ModelSpec named = model_of_shapes("wte 256x64\nh.0.w 64x64\nh.0.b 64\nh.1.w 64x64\nln_f 64\n", DType::kFloat32, "m.txt");
  CHECK(named.tensors[0].unit == 0);
  CHECK(named.tensors[1].unit == 1);
  CHECK(named.tensors[2].unit == 1);
  CHECK(named.tensors[3].unit == 2);
  CHECK(named.tensors[4].unit == 3);
  try {
    model_of_shapes("a 3x4\nb 3xz\n", DType::kFloat32, "m.txt");
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("m.txt:2") != std::string::npos);
  }
  CHECK_THROWS_AS(model_of_shapes("a 3 0\nb 4\n", DType::kFloat32, "m.txt"), InvalidArgument);
  CHECK_THROWS_AS(model_of_shapes("\n# nothing\n", DType::kFloat32, "m.txt"), InvalidArgument);
}

TEST_CASE("a safetensors header gives names, shapes and the dtype; units from the names") {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/plan_model.safetensors";
  SafetensorsLayout layout;
  layout.tensors = {{"wte.weight", DType::kBFloat16, {8, 4}}, {"h.0.attn.weight", DType::kBFloat16, {4, 4}},
                    {"ln_f.weight", DType::kBFloat16, {4}}};
  const std::string header = safetensors_header(layout);
  {
    std::ofstream f(path, std::ios::binary);
    f << header << std::string(layout.file_bytes() - header.size(), '\0');
  }
  const ModelSpec m = model_of_safetensors(path);
  REQUIRE(m.tensors.size() == 3);
  CHECK(m.dtype == DType::kBFloat16);
  CHECK(m.tensors[1].shape == std::vector<int64_t>{4, 4});
  CHECK(m.tensors[1].unit == 1);
  CHECK(m.tensors[2].unit == 2);
}

}  // namespace zero::plan
