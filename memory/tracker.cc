#include "memory/tracker.h"

#include <fmt/format.h>

#include <algorithm>
#include <new>
#include <tuple>

#include "base/check.h"

namespace zero::memory {
namespace {

void add(Usage& u, uint64_t bytes) {
  u.current += bytes;
  u.peak = std::max(u.peak, u.current);
  ++u.allocations;
}

void sub(Usage& u, uint64_t bytes) {
  u.current -= bytes;
  --u.allocations;
}

}  // namespace

const char* category_name(Category c) {
  switch (c) {
    case Category::kParams: return "params";
    case Category::kGrads: return "grads";
    case Category::kMasterParams: return "master_params";
    case Category::kOptimizerState: return "optimizer_state";
    case Category::kCommBuffer: return "comm_buffer";
    case Category::kGatherWindow: return "gather_window";
    case Category::kSecondaryShard: return "secondary_shard";
    case Category::kOffloadHost: return "offload_host";
    case Category::kOther: return "other";
  }
  return "unknown";
}

std::string Location::name() const {
  switch (kind) {
    case DeviceKind::kHost: return "host";
    case DeviceKind::kPinnedHost: return "pinned";
    case DeviceKind::kCuda: return fmt::format("cuda:{}", index);
  }
  return "unknown";
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

MemoryTracker& MemoryTracker::global() {
  // Constructed in place and never destroyed: buffers with static storage duration may be freed
  // after every other static object is gone, and must still find their tracker.
  alignas(MemoryTracker) static unsigned char storage[sizeof(MemoryTracker)];
  static MemoryTracker* const instance = ::new (static_cast<void*>(storage)) MemoryTracker();
  return *instance;
}

MemoryTracker::Slot& MemoryTracker::slot_locked(Location d) {
  for (Slot& s : slots_) {
    if (s.location == d) return s;
  }
  slots_.push_back(Slot{d});
  return slots_.back();
}

void MemoryTracker::on_alloc(Category c, Location d, size_t bytes) {
  const auto ci = static_cast<size_t>(c);
  ZERO_CHECK_LT(ci, kNumCategories, "memory category");
  std::lock_guard lock(mu_);
  Slot& slot = slot_locked(d);  // may throw bad_alloc; nothing has been changed yet
  add(slot.usage[ci], bytes);
  add(slot.total, bytes);
  add(by_category_[ci], bytes);
  total_current_ += bytes;
  total_peak_ = std::max(total_peak_, total_current_);
}

void MemoryTracker::on_free(Category c, Location d, size_t bytes) {
  const auto ci = static_cast<size_t>(c);
  ZERO_CHECK_LT(ci, kNumCategories, "memory category");
  std::lock_guard lock(mu_);
  Slot& slot = slot_locked(d);
  Usage& u = slot.usage[ci];
  // Checked before anything changes, so a mismatched free leaves the figures intact.
  ZERO_CHECK(u.allocations > 0 && u.current >= bytes,
             "freeing {} bytes of {} on {} that were not allocated (current {}, live {})", bytes,
             category_name(c), d.name(), u.current, u.allocations);
  sub(u, bytes);
  sub(slot.total, bytes);
  sub(by_category_[ci], bytes);
  total_current_ -= bytes;
}

Usage MemoryTracker::usage(Category c, Location d) const {
  const auto ci = static_cast<size_t>(c);
  ZERO_CHECK_LT(ci, kNumCategories, "memory category");
  std::lock_guard lock(mu_);
  for (const Slot& s : slots_) {
    if (s.location == d) return s.usage[ci];
  }
  return {};
}

Usage MemoryTracker::usage(Category c) const {
  const auto ci = static_cast<size_t>(c);
  ZERO_CHECK_LT(ci, kNumCategories, "memory category");
  std::lock_guard lock(mu_);
  return by_category_[ci];
}

uint64_t MemoryTracker::current_total() const {
  std::lock_guard lock(mu_);
  return total_current_;
}

uint64_t MemoryTracker::current_total(DeviceKind kind) const {
  std::lock_guard lock(mu_);
  uint64_t sum = 0;
  for (const Slot& s : slots_) {
    if (s.location.kind == kind) sum += s.total.current;
  }
  return sum;
}

uint64_t MemoryTracker::peak_total() const {
  std::lock_guard lock(mu_);
  return total_peak_;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard lock(mu_);
  for (Slot& s : slots_) {
    for (Usage& u : s.usage) u.peak = u.current;
    s.total.peak = s.total.current;
  }
  for (Usage& u : by_category_) u.peak = u.current;
  total_peak_ = total_current_;
}

std::string MemoryTracker::table() const {
  std::vector<Slot> slots;
  uint64_t total_current = 0;
  uint64_t total_peak = 0;
  {
    std::lock_guard lock(mu_);
    slots = slots_;
    total_current = total_current_;
    total_peak = total_peak_;
  }
  // Columns in a stable order (host, pinned, cuda:0, cuda:1, ...) whatever the allocation order.
  std::sort(slots.begin(), slots.end(), [](const Slot& a, const Slot& b) {
    return std::tuple(a.location.kind, a.location.index) < std::tuple(b.location.kind, b.location.index);
  });

  // Cells first, then widths, then rendering: every column right-aligned except the first.
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header{"category"};
  for (const Slot& s : slots) {
    header.push_back(s.location.name() + " current");
    header.push_back(s.location.name() + " peak");
  }
  rows.push_back(std::move(header));
  for (size_t ci = 0; ci < kNumCategories; ++ci) {
    std::vector<std::string> row{category_name(static_cast<Category>(ci))};
    for (const Slot& s : slots) {
      row.push_back(format_bytes(s.usage[ci].current));
      row.push_back(format_bytes(s.usage[ci].peak));
    }
    rows.push_back(std::move(row));
  }
  std::vector<std::string> total_row{"total"};
  for (const Slot& s : slots) {
    total_row.push_back(format_bytes(s.total.current));
    total_row.push_back(format_bytes(s.total.peak));
  }
  rows.push_back(std::move(total_row));

  std::vector<size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      if (i == 0) {
        out += fmt::format("{:<{}}", row[i], widths[i]);
      } else {
        out += fmt::format("  {:>{}}", row[i], widths[i]);
      }
    }
    out += '\n';
  }
  out += fmt::format("all devices: current {}, peak {}\n", format_bytes(total_current),
                     format_bytes(total_peak));
  return out;
}

}  // namespace zero::memory
