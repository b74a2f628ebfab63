#pragma once
// Memory accounting. Every owning buffer registers its bytes here with a category and a device, so a
// memory report shows what each part of the engine holds, now and at its peak. Thread-safe.
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
  kOffloadHost,
  kOther,
};
inline constexpr size_t kNumCategories = 8;
const char* category_name(Category c);

enum class DeviceKind : uint8_t { kHost, kPinnedHost, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kHost;
  int index = 0;  // CUDA ordinal; 0 for host memory
  static Device host() { return {DeviceKind::kHost, 0}; }
  static Device pinned_host() { return {DeviceKind::kPinnedHost, 0}; }
  static Device cuda(int ordinal) { return {DeviceKind::kCuda, ordinal}; }
  std::string name() const;  // "host", "pinned", "cuda:0"
  bool operator==(const Device&) const = default;
};

struct Usage {
  uint64_t current = 0;
  uint64_t peak = 0;
  uint64_t allocations = 0;  // live allocations
};

class MemoryTracker {
 public:
  // The process-wide tracker that buffers report to.
  static MemoryTracker& global();

  void on_alloc(Category c, Device d, size_t bytes);
  void on_free(Category c, Device d, size_t bytes);

  Usage usage(Category c, Device d) const;
  // Summed over all devices; its peak is the peak of that sum.
  Usage usage(Category c) const;
  uint64_t current_total() const;
  uint64_t current_total(DeviceKind kind) const;
  // Peak of the sum over categories (not the sum of per-category peaks).
  uint64_t peak_total() const;

  // Sets every peak to the current value.
  void reset_peaks();

  // A table: one row per category with current and peak bytes (human units) per device seen.
  std::string table() const;

 private:
  struct Slot {
    Device device;
    std::array<Usage, kNumCategories> usage{};
    Usage total{};  // summed over categories on this device; its peak is the peak of that sum
  };
  Slot& slot_locked(Device d);

  mutable std::mutex mu_;
  std::vector<Slot> slots_;
  std::array<Usage, kNumCategories> by_category_{};  // summed over devices
  uint64_t total_current_ = 0;
  uint64_t total_peak_ = 0;
};

// "1.50 MiB"-style rendering used by reports.
std::string format_bytes(uint64_t bytes);

}  // namespace zero::memory
