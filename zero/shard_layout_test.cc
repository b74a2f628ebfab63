#include "zero/shard_layout.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "base/error.h"

namespace zero {
namespace {

// Checks the invariants every consumer relies on.
void check_invariants(const ShardLayout& l, const std::vector<size_t>& numels) {
  const auto& opt = l.options();
  const int n = l.world_size();
  // Tensors: aligned, in order, disjoint.
  size_t prev_end = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    const auto& T = l.tensors()[t];
    CHECK(T.numel == numels[t]);
    CHECK(T.offset % opt.alignment == 0);
    CHECK(T.offset >= prev_end);
    CHECK(T.offset - prev_end < opt.alignment);
    prev_end = T.offset + T.numel;
  }
  CHECK(l.total_numel() == prev_end);
  // Buckets: contiguous, no padding except in the last, equal chunks.
  size_t flat = 0, shard = 0, padded = 0;
  for (size_t b = 0; b < l.buckets().size(); ++b) {
    const auto& B = l.buckets()[b];
    CHECK(B.offset == flat);
    CHECK(B.padded % (static_cast<size_t>(n) * opt.block) == 0);
    CHECK(B.chunk * n == B.padded);
    CHECK(B.shard_offset == shard);
    if (b + 1 < l.buckets().size()) CHECK(B.padded == B.numel);
    flat += B.padded;
    shard += B.chunk;
    padded += B.padded;
  }
  CHECK(l.padded_numel() == padded);
  CHECK(l.shard_numel() * n == padded);
  // Pieces of all ranks cover every tensor element exactly once, inside the owner's chunk.
  std::vector<std::vector<int>> owner(numels.size());
  for (size_t t = 0; t < numels.size(); ++t) owner[t].assign(numels[t], -1);
  for (int r = 0; r < n; ++r) {
    size_t last_shard_end = 0;
    for (const auto& p : l.pieces(r)) {
      CHECK(p.tensor_begin < p.tensor_end);
      CHECK(p.shard_offset >= last_shard_end);
      last_shard_end = p.shard_offset + (p.tensor_end - p.tensor_begin);
      CHECK(last_shard_end <= l.shard_numel());
      const size_t flat_begin = l.tensors()[p.tensor].offset + p.tensor_begin;
      const auto& B = l.buckets()[p.bucket];
      const size_t chunk_lo = l.chunk_begin(p.bucket, r);
      CHECK(flat_begin >= chunk_lo);
      CHECK(flat_begin + (p.tensor_end - p.tensor_begin) <= chunk_lo + B.chunk);
      CHECK(p.shard_offset == B.shard_offset + (flat_begin - chunk_lo));
      for (size_t e = p.tensor_begin; e < p.tensor_end; ++e) {
        REQUIRE(owner[p.tensor][e] == -1);
        owner[p.tensor][e] = r;
      }
    }
  }
  for (size_t t = 0; t < numels.size(); ++t) {
    for (int o : owner[t]) REQUIRE(o >= 0);
    auto [first, last] = l.buckets_of_tensor(t);
    CHECK(first <= last);
    CHECK(l.buckets()[first].offset <= l.tensors()[t].offset);
  }
}

}  // namespace

TEST_CASE("single small tensor, world sizes 1..8") {
  for (int n = 1; n <= 8; ++n) {
    ShardLayout l({10}, n, {.alignment = 4, .bucket_numel = 64, .block = 8});
    CHECK(l.buckets().size() == 1);
    const size_t q = static_cast<size_t>(8 * n);
    CHECK(l.buckets()[0].padded == (10 + q - 1) / q * q);
    check_invariants(l, {10});
  }
}

TEST_CASE("tensors larger than a bucket span several buckets") {
  const std::vector<size_t> numels{1000, 3, 17, 4096, 1};
  ShardLayout l(numels, 3, {.alignment = 16, .bucket_numel = 256, .block = 32});
  CHECK(l.buckets().size() > 10);
  auto [first, last] = l.buckets_of_tensor(0);
  CHECK(first == 0);
  CHECK(last >= 3);
  check_invariants(l, numels);
}

TEST_CASE("world size larger than a tensor: most ranks own padding only") {
  ShardLayout l({3, 2}, 16, {.alignment = 1, .bucket_numel = 8, .block = 1});
  check_invariants(l, {3, 2});
  int ranks_with_data = 0;
  for (int r = 0; r < 16; ++r) ranks_with_data += !l.pieces(r).empty();
  CHECK(ranks_with_data == 5);
}

TEST_CASE("flat offsets and blocks do not depend on the world size") {
  const std::vector<size_t> numels{592, 768, 48, 768, 16, 100000, 7};
  ShardLayoutOptions o{.alignment = 16, .bucket_numel = 1 << 14, .block = 256};
  ShardLayout one(numels, 1, o), four(numels, 4, o), three(numels, 3, o);
  for (size_t t = 0; t < numels.size(); ++t) {
    CHECK(one.tensors()[t].offset == four.tensors()[t].offset);
    CHECK(one.tensors()[t].offset == three.tensors()[t].offset);
  }
  // Non-last bucket boundaries agree when the bucket size is a multiple of every world * block.
  ShardLayoutOptions o2{.alignment = 16, .bucket_numel = 12 * 256 * 8, .block = 256};
  ShardLayout a(numels, 1, o2), b(numels, 4, o2), c(numels, 3, o2);
  REQUIRE(a.buckets().size() == b.buckets().size());
  for (size_t i = 0; i + 1 < a.buckets().size(); ++i) {
    CHECK(a.buckets()[i].offset == b.buckets()[i].offset);
    CHECK(a.buckets()[i].offset == c.buckets()[i].offset);
  }
  check_invariants(one, numels);
  check_invariants(four, numels);
  check_invariants(three, numels);
}

TEST_CASE("random layouts keep every invariant") {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<size_t> numels(1 + rng() % 12);
    for (auto& x : numels) x = 1 + rng() % (rng() % 2 ? 50 : 5000);
    const int n = 1 + static_cast<int>(rng() % 7);
    const size_t align = size_t{1} << (rng() % 5);
    const size_t block = align * (1 + rng() % 4);
    const size_t bucket = 1 + rng() % 3000;
    ShardLayout l(numels, n, {.alignment = align, .bucket_numel = bucket, .block = block});
    check_invariants(l, numels);
  }
}

TEST_CASE("bad layout arguments name the field") {
  CHECK_THROWS_WITH_AS(ShardLayout({4}, 0), doctest::Contains("world_size"), InvalidArgument);
  CHECK_THROWS_WITH_AS(ShardLayout({4}, 2, {.alignment = 0}), doctest::Contains("alignment"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(ShardLayout({4}, 2, {.alignment = 16, .bucket_numel = 64, .block = 24}),
                       doctest::Contains("block"), InvalidArgument);
  CHECK_THROWS_WITH_AS(ShardLayout({4, 0}, 2), doctest::Contains("tensor 1"), InvalidArgument);
}

}  // namespace zero

namespace zero {
namespace {

// Every block of the flat space that holds data, as (tensor, element) per position (-1: padding).
// Layouts that agree on this list give bitwise the same block-wise norms.
std::vector<std::vector<std::pair<int, size_t>>> data_blocks(const ShardLayout& l) {
  const size_t block = l.options().block;
  std::vector<std::vector<std::pair<int, size_t>>> blocks(l.padded_numel() / block,
                                                          std::vector<std::pair<int, size_t>>(block, {-1, 0}));
  std::vector<bool> has_data(blocks.size(), false);
  for (size_t t = 0; t < l.tensors().size(); ++t) {
    for (size_t e = 0; e < l.tensors()[t].numel; ++e) {
      const size_t f = l.tensors()[t].offset + e;
      blocks[f / block][f % block] = {static_cast<int>(t), e};
      has_data[f / block] = true;
    }
  }
  std::vector<std::vector<std::pair<int, size_t>>> out;
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (has_data[b]) out.push_back(blocks[b]);
  }
  return out;
}

}  // namespace

TEST_CASE("units start on a block; unit buckets hold one unit each; the data's blocks never change") {
  const std::vector<size_t> numels{100, 7, 300, 33, 1, 500};
  const std::vector<int> units{4, 4, 9, 9, 9, 2};
  const ShardLayoutOptions base{.alignment = 4, .bucket_numel = 128, .block = 16};
  const auto reference = data_blocks(ShardLayout(numels, 1, base, units));
  for (int n : {1, 2, 3, 4}) {
    for (bool unit_buckets : {false, true}) {
      CAPTURE(n);
      CAPTURE(unit_buckets);
      ShardLayoutOptions o = base;
      o.unit_buckets = unit_buckets;
      const ShardLayout l(numels, n, o, units);
      for (size_t t : {size_t{0}, size_t{2}, size_t{5}}) CHECK(l.tensors()[t].offset % o.block == 0);
      if (unit_buckets) {
        REQUIRE(l.buckets().size() == 3);
        CHECK(l.buckets()[1].unit == 9);
        CHECK(l.buckets()[1].first_tensor == 2);
        CHECK(l.buckets()[1].end_tensor == 5);
        size_t flat = 0;
        for (const auto& B : l.buckets()) {
          CHECK(B.offset == flat);
          CHECK(B.padded % (static_cast<size_t>(n) * o.block) == 0);
          flat += B.padded;
        }
      }
      // Every element owned exactly once across ranks.
      std::vector<std::vector<int>> owner(numels.size());
      for (size_t t = 0; t < numels.size(); ++t) owner[t].assign(numels[t], 0);
      for (int r = 0; r < n; ++r) {
        for (const auto& p : l.pieces(r)) {
          for (size_t e = p.tensor_begin; e < p.tensor_end; ++e) ++owner[p.tensor][e];
        }
      }
      for (const auto& o2 : owner) {
        for (int c : o2) REQUIRE(c == 1);
      }
      CHECK(data_blocks(l) == reference);
      for (size_t t = 0; t < numels.size(); ++t) {
        const auto [first, last] = l.buckets_of_tensor(t);
        CHECK(l.buckets()[first].offset <= l.tensors()[t].offset);
        CHECK(l.tensors()[t].offset + l.tensors()[t].numel <= l.buckets()[last].offset + l.buckets()[last].padded);
      }
    }
  }
  CHECK_THROWS_WITH_AS(ShardLayout(numels, 2, base, {4, 9, 4, 9, 9, 2}), doctest::Contains("not consecutive"),
                       InvalidArgument);
  ShardLayoutOptions ub = base;
  ub.unit_buckets = true;
  CHECK_THROWS_WITH_AS(ShardLayout(numels, 2, ub), doctest::Contains("needs each tensor's unit"), InvalidArgument);
}

TEST_CASE("dtypes: a bucket holds one dtype, bytes add each bucket in its own, and the data's blocks stay") {
  const std::vector<size_t> numels{100, 7, 300, 33, 1, 500};
  const std::vector<int> units{4, 4, 9, 9, 9, 2};
  const DType bf16 = DType::kBFloat16, fp32 = DType::kFloat32;
  const std::vector<DType> dtypes{bf16, fp32, bf16, bf16, fp32, fp32};
  const ShardLayoutOptions base{.alignment = 4, .bucket_numel = 128, .block = 16};
  const auto reference = data_blocks(ShardLayout(numels, 1, base, units, {}, dtypes));
  for (int n : {1, 2, 3, 4}) {
    for (bool unit_buckets : {false, true}) {
      for (bool whole : {false, true}) {
        CAPTURE(n);
        CAPTURE(unit_buckets);
        CAPTURE(whole);
        ShardLayoutOptions o = base;
        o.unit_buckets = unit_buckets;
        o.whole_tensors = whole;
        const ShardLayout l(numels, n, o, units, {}, dtypes);
        CHECK(l.mixed_dtypes());
        size_t bytes = 0, shard_bytes = 0;
        for (size_t b = 0; b < l.buckets().size(); ++b) {
          const ShardLayout::Bucket& B = l.buckets()[b];
          for (size_t t = B.first_tensor; t < B.end_tensor; ++t) CHECK(dtypes[t] == B.dtype);
          CHECK(B.bytes == bytes);
          CHECK(B.shard_bytes == shard_bytes);
          CHECK(l.bucket_bytes(b) == B.padded * dtype_size(B.dtype));
          bytes += B.padded * dtype_size(B.dtype);
          shard_bytes += B.chunk * dtype_size(B.dtype);
        }
        CHECK(l.padded_bytes() == bytes);
        CHECK(l.shard_bytes() == shard_bytes);
        for (size_t t = 0; t < numels.size(); ++t) {
          const auto [first, last] = l.buckets_of_tensor(t);
          const ShardLayout::Bucket& B = l.buckets()[first];
          CHECK(l.tensors()[t].dtype == dtypes[t]);
          CHECK(l.flat_bytes(first, l.tensors()[t].offset) == B.bytes + (l.tensors()[t].offset - B.offset) * dtype_size(dtypes[t]));
          // A dtype change starts a bucket, at every stage and world size.
          if (t > 0 && dtypes[t] != dtypes[t - 1]) {
            CHECK(B.first_tensor == t);
            CHECK(B.offset == l.tensors()[t].offset);
          }
        }
        if (unit_buckets) {
          REQUIRE(l.buckets().size() == 5);  // unit 4: bf16, fp32; unit 9: bf16, fp32; unit 2: fp32
          CHECK(l.buckets()[2].unit == 9);
          CHECK(l.buckets()[3].unit == 9);
          CHECK(l.buckets()[3].dtype == fp32);
        }
        if (!whole) CHECK(data_blocks(l) == reference);
      }
    }
  }
  CHECK_THROWS_WITH_AS(ShardLayout(numels, 2, base, units, {}, {bf16}), doctest::Contains("1 tensor dtypes for 6 tensors"),
                       InvalidArgument);
  // One dtype: the bytes are the elements times its size.
  const ShardLayout one(numels, 2, base, units, {}, std::vector<DType>(numels.size(), bf16));
  CHECK(!one.mixed_dtypes());
  CHECK(one.padded_bytes() == 2 * one.padded_numel());
  CHECK(one.shard_bytes() == 2 * one.shard_numel());
}

TEST_CASE("whole tensors: each tensor in one rank's chunk, on its own blocks, the largest run as small as it can be") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 5);
    const size_t count = 1 + rng() % 12;
    std::vector<size_t> numels;
    std::vector<int> units;
    for (size_t t = 0; t < count; ++t) {
      numels.push_back(1 + rng() % (rng() % 4 == 0 ? 3000 : 200));
      units.push_back(static_cast<int>(t / 3));
    }
    const bool unit_buckets = rng() % 2 == 0;
    const ShardLayoutOptions o{.alignment = 4, .bucket_numel = 512, .block = 16, .unit_buckets = unit_buckets,
                               .whole_tensors = true};
    CAPTURE(trial);
    const ShardLayout l(numels, world, o, units);
    size_t flat = 0, shard = 0, prev_end = 0;
    for (size_t b = 0; b < l.buckets().size(); ++b) {
      const ShardLayout::Bucket& B = l.buckets()[b];
      CHECK(B.offset == flat);
      CHECK(B.chunk * static_cast<size_t>(world) == B.padded);
      CHECK(B.chunk % o.block == 0);
      CHECK(B.shard_offset == shard);
      if (unit_buckets) {
        for (size_t t = B.first_tensor; t < B.end_tensor; ++t) CHECK(units[t] == B.unit);
        CHECK((B.end_tensor == count || units[B.end_tensor] != B.unit));
      } else {
        size_t blocks = 0;
        for (size_t t = B.first_tensor; t < B.end_tensor; ++t) blocks += (numels[t] + o.block - 1) / o.block;
        // Closed at the first tensor that brings it to bucket_numel and world x its largest.
        size_t largest = 0, before = 0;
        for (size_t t = B.first_tensor; t + 1 < B.end_tensor; ++t) {
          const size_t sz = (numels[t] + o.block - 1) / o.block * o.block;
          before += sz;
          largest = std::max(largest, sz);
          CHECK((before < o.bucket_numel || before < static_cast<size_t>(world) * largest));
        }
        CHECK(blocks * o.block >= before);
      }
      // Tensors in order, each on its own blocks, inside one chunk; the chunk is the largest run.
      size_t largest = 0;
      std::vector<size_t> run(static_cast<size_t>(world), 0);
      for (size_t t = B.first_tensor; t < B.end_tensor; ++t) {
        const ShardLayout::Tensor& T = l.tensors()[t];
        CHECK(T.offset % o.block == 0);
        CHECK(T.offset >= prev_end);
        prev_end = T.offset + T.numel;
        const size_t r = (T.offset - B.offset) / B.chunk;
        CHECK(prev_end <= B.offset + (r + 1) * B.chunk);
        run[r] += (T.numel + o.block - 1) / o.block * o.block;
        largest = std::max(largest, run[r]);
      }
      CHECK(largest == B.chunk);
      // No cut of these tensors into `world` consecutive runs has a smaller largest run: with a cap
      // one block less, the greedy cut (optimal for consecutive runs) needs more than `world` runs.
      if (B.chunk > o.block) {
        const size_t cap = B.chunk - o.block;
        size_t runs = 0, sum = 0;
        bool fits = true;
        for (size_t t = B.first_tensor; t < B.end_tensor; ++t) {
          const size_t sz = (numels[t] + o.block - 1) / o.block * o.block;
          if (sz > cap) fits = false;
          if (runs == 0 || sum + sz > cap) {
            ++runs;
            sum = 0;
          }
          sum += sz;
        }
        CHECK((!fits || runs > static_cast<size_t>(world)));
      }
      flat += B.padded;
      shard += B.chunk;
    }
    CHECK(l.padded_numel() == flat);
    // Every rank's pieces are whole tensors, and together they are every tensor once.
    std::vector<int> owners(count, 0);
    for (int r = 0; r < world; ++r) {
      for (const ShardLayout::Piece& p : l.pieces(r)) {
        CHECK(p.tensor_begin == 0);
        CHECK(p.tensor_end == numels[p.tensor]);
        ++owners[p.tensor];
      }
    }
    for (int c : owners) CHECK(c == 1);
  }
}

}  // namespace zero

namespace zero {
namespace {

TEST_CASE("whole-tensor buckets: marked tensors are never cut by a bucket, the rest are, every tensor on a block") {
  // An embedding-sized unmarked tensor first, then matrices (marked) and vectors (unmarked).
  const std::vector<size_t> numels{5000, 640, 37, 900, 64, 1300, 20, 700, 3000, 10};
  const std::vector<bool> marked{false, true, false, true, false, true, false, true, false, false};
  const ShardLayoutOptions o{.alignment = 4, .bucket_numel = 1000, .block = 16, .whole_tensor_buckets = true};
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    const ShardLayout l(numels, world, o, {}, {}, {}, marked);
    // Tensors in order and disjoint; buckets back to back, each padded to world x block; every
    // element in exactly one rank's pieces.
    size_t prev_end = 0, flat = 0, shard = 0;
    for (size_t t = 0; t < numels.size(); ++t) {
      CHECK(l.tensors()[t].offset >= prev_end);
      prev_end = l.tensors()[t].offset + numels[t];
    }
    for (const ShardLayout::Bucket& b : l.buckets()) {
      CHECK(b.offset == flat);
      CHECK(b.padded % (static_cast<size_t>(world) * o.block) == 0);
      CHECK(b.numel <= b.padded);
      CHECK(b.shard_offset == shard);
      flat += b.padded;
      shard += b.chunk;
    }
    CHECK(l.padded_numel() == flat);
    size_t covered = 0;
    for (int r = 0; r < world; ++r) {
      for (const ShardLayout::Piece& p : l.pieces(r)) covered += p.tensor_end - p.tensor_begin;
    }
    size_t total = 0;
    for (size_t n : numels) total += n;
    CHECK(covered == total);
    size_t unmarked_cut = 0;
    for (size_t t = 0; t < numels.size(); ++t) {
      CHECK(l.tensors()[t].offset % o.block == 0);
      const auto [first, last] = l.buckets_of_tensor(t);
      if (marked[t]) {
        CHECK(first == last);
      } else if (first != last) {
        ++unmarked_cut;
      }
    }
    CHECK(unmarked_cut >= 2);  // the 5000 and the 3000 are cut where their buckets fill
    // No bucket is larger than its capacity unless it holds a single marked tensor larger than it.
    const size_t capacity = (o.bucket_numel + world * o.block - 1) / (world * o.block) * (world * o.block);
    for (const ShardLayout::Bucket& b : l.buckets()) {
      const bool one_large = b.end_tensor - b.first_tensor == 1 && marked[b.first_tensor];
      CHECK((b.numel <= capacity || one_large));
    }
  }
  // With unit buckets (stage 3) too every tensor starts on a block: where buckets are cut only moves
  // tensors by whole blocks.
  const ShardLayout units(numels, 2, {.alignment = 4, .bucket_numel = 1000, .block = 16, .unit_buckets = true,
                                      .whole_tensor_buckets = true},
                          {0, 0, 1, 1, 1, 2, 2, 3, 4, 4});
  for (const ShardLayout::Tensor& t : units.tensors()) CHECK(t.offset % 16 == 0);
  CHECK_THROWS_WITH_AS(ShardLayout(numels, 2, o, {}, {}, {}, {true, false}), doctest::Contains("2 whole-in-bucket marks"),
                       InvalidArgument);
}

}  // namespace
}  // namespace zero
