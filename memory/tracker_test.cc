// MemoryTracker: exact figures per (category, device), peaks, reset, the table, and exact totals
// under concurrent allocation and free from 8 threads (also through real host Buffers).
#include "memory/tracker.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/error.h"
#include "memory/buffer.h"

namespace zero::memory {
namespace {

constexpr Category kAll[] = {Category::kParams,         Category::kGrads,          Category::kMasterParams,
                             Category::kOptimizerState, Category::kCommBuffer,     Category::kGatherWindow,
                             Category::kSecondaryShard, Category::kOffloadHost,    Category::kOther};
static_assert(std::size(kAll) == kNumCategories);

void check_usage(const Usage& u, uint64_t current, uint64_t peak, uint64_t allocations) {
  CHECK(u.current == current);
  CHECK(u.peak == peak);
  CHECK(u.allocations == allocations);
}

// Splits a table line into cells separated by two or more spaces (cells contain single spaces).
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    if (i >= line.size()) break;
    size_t end = line.find("  ", i);
    if (end == std::string::npos) end = line.size();
    out.push_back(line.substr(i, end - i));
    i = end;
  }
  return out;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST_CASE("format_bytes, category and device names") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1.00 KiB");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(3ull << 20) == "3.00 MiB");
  CHECK(format_bytes(5ull << 30) == "5.00 GiB");
  CHECK(format_bytes(1ull << 62) == "4.00 EiB");
  CHECK(format_bytes(std::numeric_limits<uint64_t>::max()) == "16.00 EiB");

  CHECK(std::string(category_name(Category::kParams)) == "params");
  CHECK(std::string(category_name(Category::kOptimizerState)) == "optimizer_state");
  CHECK(std::string(category_name(Category::kOther)) == "other");
  std::vector<std::string> names;
  for (Category c : kAll) names.push_back(category_name(c));
  std::sort(names.begin(), names.end());
  CHECK(std::unique(names.begin(), names.end()) == names.end());

  CHECK(Location::host().name() == "host");
  CHECK(Location::pinned_host().name() == "pinned");
  CHECK(Location::cuda(3).name() == "cuda:3");
  CHECK(Location::cuda(1) == Location::cuda(1));
  CHECK_FALSE(Location::cuda(1) == Location::cuda(0));
}

TEST_CASE("figures per category and device, peaks and reset_peaks") {
  MemoryTracker t;
  check_usage(t.usage(Category::kParams, Location::host()), 0, 0, 0);
  CHECK(t.current_total() == 0);
  CHECK(t.peak_total() == 0);

  t.on_alloc(Category::kParams, Location::host(), 100);
  t.on_alloc(Category::kGrads, Location::host(), 50);
  t.on_free(Category::kParams, Location::host(), 100);
  t.on_alloc(Category::kParams, Location::cuda(0), 30);

  check_usage(t.usage(Category::kParams, Location::host()), 0, 100, 0);
  check_usage(t.usage(Category::kParams, Location::cuda(0)), 30, 30, 1);
  check_usage(t.usage(Category::kGrads, Location::host()), 50, 50, 1);
  check_usage(t.usage(Category::kGrads, Location::cuda(0)), 0, 0, 0);
  check_usage(t.usage(Category::kParams, Location::cuda(1)), 0, 0, 0);  // never seen
  // Across devices the peak is that of the sum: params went 100, 0, 30.
  check_usage(t.usage(Category::kParams), 30, 100, 1);
  CHECK(t.current_total() == 80);
  CHECK(t.current_total(DeviceKind::kHost) == 50);
  CHECK(t.current_total(DeviceKind::kCuda) == 30);
  CHECK(t.current_total(DeviceKind::kPinnedHost) == 0);
  // Peak of the total (150 after the first two), not the sum of per-category peaks (100 + 50 + 30).
  CHECK(t.peak_total() == 150);

  t.reset_peaks();
  check_usage(t.usage(Category::kParams, Location::host()), 0, 0, 0);
  check_usage(t.usage(Category::kParams), 30, 30, 1);
  check_usage(t.usage(Category::kGrads, Location::host()), 50, 50, 1);
  CHECK(t.peak_total() == 80);

  t.on_alloc(Category::kGrads, Location::host(), 20);
  t.on_free(Category::kGrads, Location::host(), 20);
  check_usage(t.usage(Category::kGrads, Location::host()), 50, 70, 1);
  CHECK(t.peak_total() == 100);
  CHECK(t.current_total() == 80);
}

TEST_CASE("a free that was never allocated throws and changes nothing") {
  MemoryTracker t;
  t.on_alloc(Category::kGrads, Location::host(), 10);
  CHECK_THROWS_AS(t.on_free(Category::kGrads, Location::host(), 11), CheckError);
  CHECK_THROWS_AS(t.on_free(Category::kParams, Location::host(), 1), CheckError);
  CHECK_THROWS_AS(t.on_free(Category::kGrads, Location::cuda(0), 1), CheckError);
  check_usage(t.usage(Category::kGrads, Location::host()), 10, 10, 1);
  CHECK(t.current_total() == 10);
  t.on_free(Category::kGrads, Location::host(), 10);
  CHECK(t.current_total() == 0);
}

TEST_CASE("table names every category and shows the figures, aligned") {
  MemoryTracker t;
  t.on_alloc(Category::kParams, Location::host(), 2048);
  t.on_free(Category::kParams, Location::host(), 2048);
  t.on_alloc(Category::kParams, Location::host(), 1536);
  t.on_alloc(Category::kGrads, Location::cuda(0), 3u << 20);
  t.on_alloc(Category::kOffloadHost, Location::pinned_host(), 100);

  const std::string table = t.table();
  INFO(table);
  for (Category c : kAll) CHECK(table.find(category_name(c)) != std::string::npos);

  const auto rows = lines(table);
  // Header, a line per category (in the enum's order), total, and the all-devices line.
  REQUIRE(rows.size() == kNumCategories + 3);
  for (size_t i = 1; i < kNumCategories + 2; ++i) CHECK(rows[i].size() == rows[0].size());

  // Columns in device order host, pinned, cuda:0 whatever the allocation order.
  CHECK(cells(rows[0]) == std::vector<std::string>{"category", "host current", "host peak",
                                                   "pinned current", "pinned peak",
                                                   "cuda:0 current", "cuda:0 peak"});
  CHECK(cells(rows[1]) == std::vector<std::string>{"params", "1.50 KiB", "2.00 KiB", "0 B", "0 B",
                                                   "0 B", "0 B"});
  CHECK(cells(rows[2]) ==
        std::vector<std::string>{"grads", "0 B", "0 B", "0 B", "0 B", "3.00 MiB", "3.00 MiB"});
  CHECK(cells(rows[static_cast<size_t>(Category::kOffloadHost) + 1]) ==
        std::vector<std::string>{"offload_host", "0 B", "0 B", "100 B", "100 B", "0 B", "0 B"});
  CHECK(cells(rows[kNumCategories + 1]) == std::vector<std::string>{"total", "1.50 KiB", "2.00 KiB",
                                                                    "100 B", "100 B", "3.00 MiB",
                                                                    "3.00 MiB"});
  // The 2 KiB were freed before anything else was allocated, so the peak of the total is now.
  CHECK(rows.back() == "all devices: current " + format_bytes(1536 + (3u << 20) + 100) +
                           ", peak " + format_bytes(1536 + (3u << 20) + 100));
}

TEST_CASE("exact figures under concurrent on_alloc/on_free from 8 threads") {
  MemoryTracker t;
  constexpr int kThreads = 8;
  constexpr int kIters = 4000;
  // Per thread: bytes still live per (category, device) at the end, and allocations live.
  struct Live {
    std::array<uint64_t, kNumCategories> host{};
    std::array<uint64_t, kNumCategories> cuda{};
    std::array<uint64_t, kNumCategories> host_count{};
    std::array<uint64_t, kNumCategories> cuda_count{};
  };
  std::vector<Live> live(kThreads);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937_64 rng(th + 1);
      struct Block {
        Category c;
        Location d;
        uint64_t bytes;
      };
      std::vector<Block> held;
      for (int i = 0; i < kIters; ++i) {
        if (!held.empty() && rng() % 3 == 0) {
          const size_t k = rng() % held.size();
          t.on_free(held[k].c, held[k].d, held[k].bytes);
          held[k] = held.back();
          held.pop_back();
        } else {
          const Block b{kAll[rng() % kNumCategories], rng() % 2 ? Location::host() : Location::cuda(0),
                        1 + rng() % 100000};
          t.on_alloc(b.c, b.d, b.bytes);
          held.push_back(b);
        }
      }
      for (const Block& b : held) {
        const auto ci = static_cast<size_t>(b.c);
        if (b.d == Location::host()) {
          live[th].host[ci] += b.bytes;
          ++live[th].host_count[ci];
        } else {
          live[th].cuda[ci] += b.bytes;
          ++live[th].cuda_count[ci];
        }
      }
    });
  }
  for (auto& th : threads) th.join();

  uint64_t total = 0;
  for (size_t ci = 0; ci < kNumCategories; ++ci) {
    uint64_t host = 0, cuda = 0, host_count = 0, cuda_count = 0;
    for (const Live& l : live) {
      host += l.host[ci];
      cuda += l.cuda[ci];
      host_count += l.host_count[ci];
      cuda_count += l.cuda_count[ci];
    }
    const Category c = kAll[ci];
    CHECK(t.usage(c, Location::host()).current == host);
    CHECK(t.usage(c, Location::host()).allocations == host_count);
    CHECK(t.usage(c, Location::cuda(0)).current == cuda);
    CHECK(t.usage(c, Location::cuda(0)).allocations == cuda_count);
    CHECK(t.usage(c).current == host + cuda);
    CHECK(t.usage(c).peak >= host + cuda);
    total += host + cuda;
  }
  CHECK(t.current_total() == total);
  CHECK(t.peak_total() >= total);
  t.reset_peaks();
  CHECK(t.peak_total() == total);
}

TEST_CASE("global tracker equals the bytes of live host Buffers under 8 threads") {
  MemoryTracker& g = MemoryTracker::global();
  g.reset_peaks();
  std::array<uint64_t, kNumCategories> base{};
  std::array<uint64_t, kNumCategories> base_count{};
  for (size_t ci = 0; ci < kNumCategories; ++ci) {
    base[ci] = g.usage(kAll[ci], Location::host()).current;
    base_count[ci] = g.usage(kAll[ci], Location::host()).allocations;
  }
  const uint64_t base_total = g.current_total();

  constexpr int kThreads = 8;
  constexpr int kIters = 1500;
  std::vector<std::vector<Buffer>> kept(kThreads);
  // Largest bytes each thread held at once per category: a lower bound for that category's peak.
  std::vector<std::array<uint64_t, kNumCategories>> own_peak(kThreads);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937 rng(100 + th);
      std::array<uint64_t, kNumCategories> held{};
      own_peak[th] = {};
      auto& mine = kept[th];
      for (int i = 0; i < kIters; ++i) {
        if (!mine.empty() && rng() % 2 == 0) {
          const size_t k = rng() % mine.size();
          held[static_cast<size_t>(mine[k].category())] -= mine[k].size_bytes();
          mine[k] = std::move(mine.back());  // move-assign frees mine[k]'s bytes exactly once
          mine.pop_back();
        } else {
          const Category c = kAll[rng() % kNumCategories];
          mine.push_back(allocate_host(1 + rng() % 20000, c));
          const auto ci = static_cast<size_t>(c);
          held[ci] += mine.back().size_bytes();
          own_peak[th][ci] = std::max(own_peak[th][ci], held[ci]);
        }
      }
    });
  }
  for (auto& th : threads) th.join();

  uint64_t total = 0;
  for (size_t ci = 0; ci < kNumCategories; ++ci) {
    uint64_t bytes = 0, count = 0, peak_low = 0;
    for (int th = 0; th < kThreads; ++th) {
      for (const Buffer& b : kept[th]) {
        if (static_cast<size_t>(b.category()) == ci) {
          bytes += b.size_bytes();
          ++count;
        }
      }
      peak_low = std::max(peak_low, own_peak[th][ci]);
    }
    const Usage u = g.usage(kAll[ci], Location::host());
    CHECK(u.current - base[ci] == bytes);
    CHECK(u.allocations - base_count[ci] == count);
    CHECK(u.peak - base[ci] >= peak_low);
    total += bytes;
  }
  CHECK(g.current_total() - base_total == total);

  kept.clear();  // frees everything
  for (size_t ci = 0; ci < kNumCategories; ++ci) {
    CHECK(g.usage(kAll[ci], Location::host()).current == base[ci]);
    CHECK(g.usage(kAll[ci], Location::host()).allocations == base_count[ci]);
  }
  CHECK(g.current_total() == base_total);
}

TEST_CASE("buffers given a tracker report to it, release to it, and leave the global one alone") {
  MemoryTracker& g = MemoryTracker::global();
  const uint64_t global_before = g.current_total();
  MemoryTracker a, b;  // e.g. two engines in one process
  {
    Buffer x = allocate_host(1000, Category::kParams, a);
    Buffer y = allocate_host_elements(10, DType::kFloat32, Category::kGrads, b);
    Buffer z = allocate_pinned(4096, Category::kOffloadHost, b);
    Buffer w = allocate_pinned_elements(8, DType::kFloat64, Category::kOther, a);
    CHECK(a.current_total() == 1000 + 64);
    CHECK(b.current_total() == 40 + 4096);
    CHECK(a.usage(Category::kParams, Location::host()).current == 1000);
    CHECK(b.usage(Category::kParams).current == 0);
    CHECK(b.usage(Category::kGrads, Location::host()).current == 40);
    CHECK(g.current_total() == global_before);

    // A move carries the tracker along: freeing through the new owner releases to `a`.
    Buffer moved = std::move(x);
    Buffer other = allocate_host(10, Category::kParams, b);
    other = std::move(moved);  // frees b's 10 bytes, takes over a's 1000
    CHECK(b.usage(Category::kParams).current == 0);
    CHECK(a.usage(Category::kParams).current == 1000);
    Buffer pz = std::move(z);
    CHECK(b.current_total() == 40 + 4096);
  }
  CHECK(a.current_total() == 0);
  CHECK(b.current_total() == 0);
  CHECK(a.peak_total() == 1000 + 64);
  CHECK(g.current_total() == global_before);
}

}  // namespace
}  // namespace zero::memory
