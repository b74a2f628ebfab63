// The encodings a checkpoint stores optimizer states in: each round trip bit for bit (the signed
// and unsigned maps, zeros of either sign under a zero scale, a short last block, a piece starting
// inside a row, a period longer than the piece, a sub-range decoded), and each refusal where the
// values are not what the encoding describes.
#include "zero/checkpoint/state_encoding.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "optim/dynamic_quantization.h"

namespace zero {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> decoded(const StateEncoding& e, const std::vector<char>& bytes, size_t n, size_t lo, size_t hi) {
  std::vector<float> out(hi - lo);
  decode_state(e, bytes.data(), n, lo, hi, out.data());
  return out;
}

// Values as 8-bit AdamW's read_state gives them: map[code] * the block's scale, and the scales
// repeated on their blocks' elements.
struct Moment {
  std::vector<float> values, scales;
};
Moment moment(bool is_signed, size_t n, size_t block, const std::vector<float>& block_scales) {
  const optim::DynamicMap& map = optim::dynamic_map(is_signed);
  Moment m;
  for (size_t i = 0; i < n; ++i) {
    const float scale = block_scales[i / block];
    m.scales.push_back(scale);
    m.values.push_back(map.values[(i * 37 + 11) % 256] * scale);
  }
  return m;
}

}  // namespace

TEST_CASE("a dynamic8 piece stores a byte per element and a scale per block, and decodes to the same bits") {
  for (const bool is_signed : {true, false}) {
    CAPTURE(is_signed);
    const StateEncoding e{.kind = StateEncoding::Kind::kDynamic8, .block = 4, .is_signed = is_signed};
    // Blocks of 4, the last of 2; the third block's scale is 0 (a block never stepped).
    const size_t n = 14;
    Moment m = moment(is_signed, n, 4, {0.5f, 3.0e-7f, 0.0f, 1.25e4f});
    // A zero scale reads zeros of the entry's sign (the unsigned map's entries are all >= 0).
    m.values[8] = is_signed ? -0.0f : 0.0f;
    m.values[9] = 0.0f;
    m.values[10] = is_signed ? -0.0f : 0.0f;
    m.values[11] = 0.0f;
    std::vector<char> bytes;
    REQUIRE(encode_state(e, m.values.data(), m.scales.data(), n, bytes));
    CHECK(bytes.size() == 4 * sizeof(float) + n);
    CHECK(e.bytes(n) == bytes.size());
    CHECK(same_bits(decoded(e, bytes, n, 0, n), m.values));
    // A sub-range that starts and ends inside blocks.
    CHECK(same_bits(decoded(e, bytes, n, 3, 13), std::vector<float>(m.values.begin() + 3, m.values.begin() + 13)));
  }
}

TEST_CASE("dynamic8 refuses values the map and the scale do not give") {
  const StateEncoding e{.kind = StateEncoding::Kind::kDynamic8, .block = 4, .is_signed = true};
  Moment m = moment(true, 8, 4, {0.5f, 2.0f});
  std::vector<char> bytes;
  SUBCASE("an fp32 moment (a tensor 8-bit AdamW keeps in fp32)") { m.values[5] = 0.123456789f; }
  SUBCASE("a value beside a zero scale") {
    m.scales.assign(8, 0.0f);
    m.values.assign(8, 0.0f);
    m.values[2] = 1e-30f;
  }
  SUBCASE("a NaN") { m.values[0] = std::nanf(""); }
  CHECK_FALSE(encode_state(e, m.values.data(), m.scales.data(), 8, bytes));
}

TEST_CASE("block_constant stores one value per block, and refuses a block that is not constant") {
  const StateEncoding e{.kind = StateEncoding::Kind::kBlockConstant, .block = 3};
  std::vector<float> v = {2.5f, 2.5f, 2.5f, -0.0f, -0.0f, -0.0f, 7.0f};
  std::vector<char> bytes;
  REQUIRE(encode_state(e, v.data(), nullptr, v.size(), bytes));
  CHECK(bytes.size() == 3 * sizeof(float));
  CHECK(same_bits(decoded(e, bytes, v.size(), 0, v.size()), v));
  CHECK(same_bits(decoded(e, bytes, v.size(), 2, 4), {2.5f, -0.0f}));
  v[4] = 0.0f;  // +0 beside -0: other bits
  CHECK_FALSE(encode_state(e, v.data(), nullptr, v.size(), bytes));
}

TEST_CASE("block_constant with a phase: a piece that starts inside its first block (a row's statistic)") {
  // Rows of 4; the piece starts at element 3 of its row: 1 + 4 + 4 + 2 elements.
  const StateEncoding e{.kind = StateEncoding::Kind::kBlockConstant, .block = 4, .phase = 3};
  const std::vector<float> v = {1.0f, 2.0f, 2.0f, 2.0f, 2.0f, 3.0f, 3.0f, 3.0f, 3.0f, 4.0f, 4.0f};
  std::vector<char> bytes;
  REQUIRE(encode_state(e, v.data(), nullptr, v.size(), bytes));
  CHECK(bytes.size() == 4 * sizeof(float));
  CHECK(same_bits(decoded(e, bytes, v.size(), 0, v.size()), v));
  CHECK(same_bits(decoded(e, bytes, v.size(), 4, 6), {2.0f, 3.0f}));
  // Without the phase the rows do not line up.
  CHECK_FALSE(encode_state({.kind = StateEncoding::Kind::kBlockConstant, .block = 4}, v.data(), nullptr, v.size(), bytes));
  // One value for a uniform piece.
  const std::vector<float> zeros(1000, 0.0f);
  REQUIRE(encode_state(uniform_encoding(zeros.size()), zeros.data(), nullptr, zeros.size(), bytes));
  CHECK(bytes.size() == sizeof(float));
  CHECK(same_bits(decoded(uniform_encoding(zeros.size()), bytes, zeros.size(), 10, 1000), std::vector<float>(990, 0.0f)));
}

TEST_CASE("periodic stores one period (a column's statistic), from the piece's first element") {
  const StateEncoding e{.kind = StateEncoding::Kind::kPeriodic, .block = 3};
  const std::vector<float> v = {5.0f, 6.0f, 7.0f, 5.0f, 6.0f, 7.0f, 5.0f, 6.0f};
  std::vector<char> bytes;
  REQUIRE(encode_state(e, v.data(), nullptr, v.size(), bytes));
  CHECK(bytes.size() == 3 * sizeof(float));
  CHECK(same_bits(decoded(e, bytes, v.size(), 2, 8), std::vector<float>(v.begin() + 2, v.end())));
  // A piece shorter than the period keeps what it has.
  CHECK(e.bytes(2) == 2 * sizeof(float));
  std::vector<float> off = v;
  off[7] = 6.5f;
  CHECK_FALSE(encode_state(e, off.data(), nullptr, off.size(), bytes));
}

TEST_CASE("the index's names of the encodings") {
  StateEncoding::Kind k{};
  CHECK(parse_state_encoding_kind("dynamic8", &k));
  CHECK(k == StateEncoding::Kind::kDynamic8);
  CHECK(parse_state_encoding_kind(state_encoding_name(StateEncoding::Kind::kBlockConstant), &k));
  CHECK(k == StateEncoding::Kind::kBlockConstant);
  CHECK(parse_state_encoding_kind("periodic", &k));
  CHECK(k == StateEncoding::Kind::kPeriodic);
  CHECK_FALSE(parse_state_encoding_kind("none", &k));
  CHECK_FALSE(parse_state_encoding_kind("int4", &k));
}

}  // namespace zero
