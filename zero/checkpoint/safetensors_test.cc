#include "zero/checkpoint/safetensors.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "base/error.h"

namespace zero {
namespace {

std::string tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string with_length(const std::string& json, uint64_t length) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((length >> (8 * i)) & 0xFF);
  return s + json;
}

std::string write(const std::string& name, const std::string& bytes) {
  const std::string path = tmp(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

}  // namespace

TEST_CASE("a header we write reads back, padded to 8 bytes, offsets contiguous from 0") {
  SafetensorsLayout out;
  out.tensors = {{"a", DType::kFloat32, {2, 3}}, {"b", DType::kBFloat16, {5}}, {"c", DType::kFloat16, {}}};
  out.metadata["format"] = "pt";
  const std::string header = safetensors_header(out);
  CHECK(header.size() % 8 == 0);
  CHECK(out.data_start == header.size());
  CHECK(out.tensors[1].begin == 24);
  CHECK(out.tensors[1].end == 34);
  CHECK(out.tensors[2].end == 36);
  const std::string path = write("good.safetensors", header + std::string(36, '\x01'));
  const SafetensorsLayout in = read_safetensors_header(path);
  REQUIRE(in.tensors.size() == 3);
  CHECK(in.tensors[0].name == "a");
  CHECK(in.tensors[0].shape == std::vector<int64_t>{2, 3});
  CHECK(in.tensors[1].dtype == DType::kBFloat16);
  CHECK(in.metadata.at("format") == "pt");
  CHECK(in.file_bytes() == header.size() + 36);
}

TEST_CASE("bad headers name the file and what is wrong") {
  auto fails = [](const std::string& name, const std::string& bytes, const std::string& needle) {
    const std::string path = write(name, bytes);
    CAPTURE(name);
    CHECK_THROWS_WITH_AS(read_safetensors_header(path), doctest::Contains(needle.c_str()), InvalidArgument);
    CHECK_THROWS_WITH_AS(read_safetensors_header(path), doctest::Contains(name.c_str()), InvalidArgument);
  };
  fails("short.safetensors", "abc", "too short");
  fails("absurd.safetensors", with_length("{}", uint64_t{1} << 60), "header length");
  fails("notjson.safetensors", with_length("{nope", 5), "not JSON");
  const std::string entry = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string range = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})";
  fails("range.safetensors", with_length(range, range.size()) + std::string(8, '\0'), "do not hold 2 elements");
  fails("past.safetensors", with_length(entry, entry.size()) + std::string(4, '\0'), "past the end");
  const std::string dtype = R"({"t":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})";
  fails("dtype.safetensors", with_length(dtype, dtype.size()) + std::string(8, '\0'), "unsupported dtype");
  const std::string hole = R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  fails("hole.safetensors", with_length(hole, hole.size()) + std::string(8, '\0'), "a hole");
  fails("trailing.safetensors", with_length(entry, entry.size()) + std::string(12, '\0'), "the file has");
}

}  // namespace zero
