#pragma once
// Memory accounting. Every owning buffer registers its bytes here with a category and a location, so
// a memory report shows what each part of the engine holds, now and at its peak. Thread-safe.
//
// One tracker per engine (an engine owns one and passes it to its buffers and its memory::Device), so
// two engines in one process report separately; MemoryTracker::global() is the default for buffers
// that are given none.
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace zero::memory {

enum class Category : uint8_t {
  kParams,
  kGrads,
  kMasterParams,
  kOptimizerState,
  kCommBuffer,
  kGatherWindow,
  kSecondaryShard,  // hpZ: the node parts of the forward's gathers, kept to the step's end
  kOffloadHost,
  kOther,
};
inline constexpr size_t kNumCategories = 9;
const char* category_name(Category c);

enum class DeviceKind : uint8_t { kHost, kPinnedHost, kCuda };

// Where bytes live: a memory kind and, for CUDA, the device ordinal. (Not memory::Device, the
// allocation and stream interface of memory/device.h, which owns bytes at a Location.)
struct Location {
  DeviceKind kind = DeviceKind::kHost;
  int index = 0;  // CUDA ordinal; 0 for host memory
  static Location host() { return {DeviceKind::kHost, 0}; }
  static Location pinned_host() { return {DeviceKind::kPinnedHost, 0}; }
  static Location cuda(int ordinal) { return {DeviceKind::kCuda, ordinal}; }
  std::string name() const;  // "host", "pinned", "cuda:0"
  bool operator==(const Location&) const = default;
};

struct Usage {
  uint64_t current = 0;
  uint64_t peak = 0;
  uint64_t allocations = 0;  // live allocations
};

class MemoryTracker {
 public:
  MemoryTracker() = default;
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  // The process-wide tracker that buffers report to when they are given no other.
  static MemoryTracker& global();

  void on_alloc(Category c, Location d, size_t bytes);
  void on_free(Category c, Location d, size_t bytes);

  Usage usage(Category c, Location d) const;
  // Summed over all locations; its peak is the peak of that sum.
  Usage usage(Category c) const;
  uint64_t current_total() const;
  uint64_t current_total(DeviceKind kind) const;
  // Peak of the sum over categories (not the sum of per-category peaks).
  uint64_t peak_total() const;

  // Sets every peak to the current value.
  void reset_peaks();

  // A table: one row per category with current and peak bytes (human units) per location seen.
  std::string table() const;

 private:
  struct Slot {
    Location location;
    std::array<Usage, kNumCategories> usage{};
    Usage total{};  // summed over categories on this device; its peak is the peak of that sum
  };
  Slot& slot_locked(Location d);

  mutable std::mutex mu_;
  std::vector<Slot> slots_;
  std::array<Usage, kNumCategories> by_category_{};  // summed over locations
  uint64_t total_current_ = 0;
  uint64_t total_peak_ = 0;
};

// "1.50 MiB"-style rendering used by reports.
std::string format_bytes(uint64_t bytes);

}  // namespace zero::memory
