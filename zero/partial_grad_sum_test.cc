// PartialGradSum on two ranks as threads over Gloo: the pieces' sums land in place, in fp32 and bf16,
// with every element outside them untouched; one packed all-reduce per dtype (a lone piece in place,
// without a pack buffer), counted on a planning communicator.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "comm/planning_communicator.h"
#include "memory/device.h"
#include "testing/thread_ranks.h"
#include "zero/partial_grad_sum.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

// Bucket 0 and 1 in fp32, bucket 2 in bf16; two fp32 pieces (in different buckets) and one bf16.
const std::vector<PartialGradSum::Piece> kPieces = {
    {.bucket = 0, .offset = 2, .len = 3, .dtype = DType::kFloat32},
    {.bucket = 1, .offset = 0, .len = 4, .dtype = DType::kFloat32},
    {.bucket = 2, .offset = 1, .len = 2, .dtype = DType::kBFloat16},
};

bool in_piece(size_t bucket, size_t e) {
  for (const PartialGradSum::Piece& p : kPieces) {
    if (p.bucket == bucket && e >= p.offset && e < p.offset + p.len) return true;
  }
  return false;
}

// Rank r's value at element e of a bucket: small integers, exact in bf16 and in their sums.
float value(int rank, size_t bucket, size_t e) { return static_cast<float>((rank + 1) * (1 + static_cast<int>(e + 3 * bucket))); }

}  // namespace

TEST_CASE("the partial pieces are summed over tp in place, one packed call per dtype") {
  testing::run_thread_ranks(2, [](comm::Communicator& tp) {
    memory::MemoryTracker tracker;
    std::unique_ptr<memory::Device> device = memory::make_host_device(tracker, {});
    std::vector<std::vector<float>> f32 = {std::vector<float>(8), std::vector<float>(5)};
    std::vector<float> b16_values(4);
    for (size_t b = 0; b < 2; ++b) {
      for (size_t e = 0; e < f32[b].size(); ++e) f32[b][e] = value(tp.rank(), b, e);
    }
    for (size_t e = 0; e < b16_values.size(); ++e) b16_values[e] = value(tp.rank(), 2, e);
    std::vector<uint16_t> b16(b16_values.size());
    convert_fp32_to_bf16(b16_values.data(), b16.data(), b16.size());

    PartialGradSum sum(*device, tp, kPieces, 30s);
    // The fp32 pieces go packed (7 elements); the lone bf16 piece needs no pack.
    CHECK(tracker.usage(memory::Category::kCommBuffer).current == 7 * sizeof(float));
    sum.run([&](size_t b) -> void* { return b < 2 ? static_cast<void*>(f32[b].data()) : b16.data(); });
    device->synchronize(device->compute_stream(), 30s);

    for (size_t b = 0; b < 2; ++b) {
      for (size_t e = 0; e < f32[b].size(); ++e) {
        CAPTURE(b);
        CAPTURE(e);
        const float want = in_piece(b, e) ? value(0, b, e) + value(1, b, e) : value(tp.rank(), b, e);
        CHECK(f32[b][e] == want);
      }
    }
    std::vector<float> got(b16.size());
    convert_bf16_to_fp32(b16.data(), got.data(), got.size());
    for (size_t e = 0; e < got.size(); ++e) {
      CAPTURE(e);
      CHECK(got[e] == (in_piece(2, e) ? value(0, 2, e) + value(1, 2, e) : value(tp.rank(), 2, e)));
    }
  });
}

TEST_CASE("one all-reduce per dtype, carrying every piece's bytes once") {
  memory::MemoryTracker tracker;
  std::unique_ptr<memory::Device> device = memory::make_host_device(tracker, {});
  comm::PlanningCommunicator tp(0, 2, [](const void*, size_t) { return true; }, memory::DeviceKind::kHost);
  std::vector<float> f32(16);
  std::vector<uint16_t> b16(8);
  PartialGradSum sum(*device, tp, kPieces, 30s);
  sum.run([&](size_t b) -> void* { return b < 2 ? static_cast<void*>(f32.data()) : b16.data(); });
  REQUIRE(tp.tallies().count("all_reduce") == 1);
  const comm::CollectiveTally& t = tp.tallies().at("all_reduce");
  CHECK(t.calls == 2);
  CHECK(t.payload_bytes == 7 * 4 + 2 * 2);
  CHECK(tp.tallies().size() == 1);  // nothing else
}

}  // namespace zero
