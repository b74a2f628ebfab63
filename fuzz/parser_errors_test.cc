// The errors the fuzzing fixes added (docs/fuzzing.md, "Findings"): the replay tests check that
// these inputs no longer crash; this checks that each is refused with an error naming the file and
// the field, as every other error of these parsers does.
#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/error.h"
#include "zero/checkpoint/checkpoint_manifest.h"
#include "zero/checkpoint/safetensors.h"

namespace zero {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read ", path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string index_error(const std::string& path) {
  Manifest m;
  try {
    parse_index(slurp(path), path, 0, uint64_t{1} << 20, m);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

std::string manifest_error(const std::string& path) {
  try {
    const Manifest m = parse_manifest(slurp(path), path);
    for (const auto& p : checkpoint_field<nlohmann::json>(m.doc, "params", path)) {
      checkpoint_field<std::vector<int64_t>>(p, "shape", path);
    }
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

const std::string kRegressions = "fuzz/regressions/manifest/";

}  // namespace

TEST_CASE("an index whose byte count or offset wraps around 2^64 is inconsistent") {
  CHECK(index_error(kRegressions + "index-bytes-wrap.json") ==
        "checkpoint '" + kRegressions + "index-bytes-wrap.json': piece master [0, 4611686018427387904) of 'w' is "
        "inconsistent");
  CHECK(index_error(kRegressions + "index-offset-wrap.json") ==
        "checkpoint '" + kRegressions + "index-offset-wrap.json': piece master [0, 4) of 'w' is inconsistent");
}

TEST_CASE("a float in an integer field is the wrong type, an integer beyond the field's type out of range") {
  CHECK(index_error(kRegressions + "index-float-offset.json") ==
        "checkpoint '" + kRegressions + "index-float-offset.json': field 'offset' has the wrong type: 2.09444e+113");
  CHECK(index_error(kRegressions + "index-float-begin.json") ==
        "checkpoint '" + kRegressions + "index-float-begin.json': field 'begin' has the wrong type: -1e+30");
  CHECK(manifest_error(kRegressions + "manifest-float-version.json") ==
        "checkpoint '" + kRegressions + "manifest-float-version.json': field 'version' has the wrong type: 1e+300");
  CHECK(manifest_error(kRegressions + "manifest-version-wraps.json") ==
        "checkpoint '" + kRegressions + "manifest-version-wraps.json': field 'version' is out of range: 4294967297");
  CHECK(manifest_error(kRegressions + "manifest-float-shape.json") ==
        "checkpoint '" + kRegressions + "manifest-float-shape.json': field 'shape' has the wrong type: [4,1e+40]");
}

TEST_CASE("an index with an unknown dtype names the file and the field") {
  const std::string path = "fuzz/corpus/manifest/bad-index-dtype.json";
  CHECK(index_error(path) ==
        "checkpoint '" + path +
            "': field 'dtype': unknown dtype 'fp8' (expected fp32, fp16, bf16, fp64, int32, int64 or uint8)");
}

TEST_CASE("an encoded state piece takes its encoding's bytes; another encoding or byte count is named") {
  Manifest m;
  const std::string good = "fuzz/corpus/manifest/index-encoded-8bit.json";
  parse_index(slurp(good), good, 0, uint64_t{1} << 20, m);
  const std::vector<SavedPiece>& w = m.pieces.at("w");
  REQUIRE(w.size() == 3);
  CHECK(w[1].encoding == StateEncoding{.kind = StateEncoding::Kind::kDynamic8, .block = 128, .is_signed = true});
  CHECK(w[2].encoding == StateEncoding{.kind = StateEncoding::Kind::kBlockConstant, .block = 128});
  const std::string bad = "fuzz/corpus/manifest/bad-index-encoding.json";
  CHECK(index_error(bad) == "checkpoint '" + bad + "': piece state:exp_avg [0, 256) of 'w': unknown encoding 'dynamic4'");
  // The same piece a byte short of its codes.
  std::string text = slurp(good);
  const std::string from = "\"bytes\": 264";
  text.replace(text.find(from), from.size(), "\"bytes\": 263");
  Manifest again;
  CHECK_THROWS_WITH_AS(parse_index(text, good, 0, uint64_t{1} << 20, again),
                       doctest::Contains("piece state:exp_avg [0, 256) of 'w' is inconsistent"), InvalidArgument);
}

TEST_CASE("safetensors bytes shorter than the header they announce are refused, naming the source") {
  SafetensorsLayout l;
  l.tensors = {{"w", DType::kFloat32, {2}}};
  const std::string header = safetensors_header(l);
  CHECK_THROWS_WITH_AS(parse_safetensors_header(std::string_view(header).substr(0, 20), header.size() + 8, "x.st"),
                       doctest::Contains("safetensors 'x.st': 12 header bytes given"), InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_safetensors_header(std::string_view(header).substr(0, 5), header.size() + 8, "x.st"),
                       doctest::Contains("safetensors 'x.st': 5 bytes given"), InvalidArgument);
  CHECK(parse_safetensors_header(header, header.size() + 8, "x.st").tensors.size() == 1);
}

}  // namespace zero
