// The planning device (memory/meta_device.h).
#include "memory/meta_device.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "base/check.h"
#include "memory/block_quantization.h"
#include "memory/block_quantization_kernels.h"
#include "memory/host_kernels.h"
#include "memory/op_checks.h"

namespace zero::memory {
namespace {

constexpr const char* kDeviceName = "meta";

// The unbacked ranges of one device, shared with its allocations (which may outlive a lookup).
class AddressSpace {
 public:
  // `bytes` of address space that reads as zeros (the kernel's shared zero page: no memory) and
  // faults when written.
  void* reserve(size_t bytes) {
    {
      std::lock_guard lock(mu_);
      const auto it = pooled_.find(bytes);
      if (it != pooled_.end()) {
        void* p = reinterpret_cast<void*>(it->second);
        pooled_.erase(it);
        return p;
      }
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      ZERO_THROW(AllocationError, "meta device: cannot reserve {} bytes of address space: {}", bytes,
                 std::strerror(errno));
    }
    std::lock_guard lock(mu_);
    ranges_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  // The range stays reserved for the next reserve() of its size: an engine takes and gives back the
  // same buffers many times in a plan, and a map and an unmap each time were a third of a strategy
  // search. It still reads as zeros (it was never writable); the device unmaps it at the end.
  void release(void* p) {
    std::lock_guard lock(mu_);
    const auto it = ranges_.find(reinterpret_cast<uintptr_t>(p));
    if (it != ranges_.end()) pooled_.emplace(it->second, it->first);
  }
  bool overlaps(const void* p, size_t bytes) const {
    if (bytes == 0) return false;
    const auto lo = reinterpret_cast<uintptr_t>(p), hi = lo + bytes;
    std::lock_guard lock(mu_);
    auto it = ranges_.upper_bound(lo);  // the first range starting after lo
    if (it != ranges_.end() && it->first < hi) return true;
    if (it == ranges_.begin()) return false;
    --it;
    return it->first + it->second > lo;
  }
  ~AddressSpace() {
    for (const auto& [p, bytes] : ranges_) ::munmap(reinterpret_cast<void*>(p), bytes);
  }

 private:
  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> ranges_;         // every range mapped: start, bytes
  std::multimap<size_t, uintptr_t> pooled_;    // those released: bytes, start
};

// A buffer of the meta device: real and zeroed when small, address space otherwise; accounted in
// the tracker for its life.
class MetaAllocation final : public Buffer::Allocation {
 public:
  MetaAllocation(std::shared_ptr<AddressSpace> space, size_t bytes, Category category, Location location,
                 MemoryTracker& tracker)
      : space_(std::move(space)), bytes_(bytes), category_(category), location_(location), tracker_(tracker) {
    if (bytes <= kAddressableBytes) {
      real_ = std::make_unique<char[]>(bytes);  // value-initialized: zeroed
      data_ = real_.get();
    } else {
      data_ = space_->reserve(bytes);
    }
    tracker_.on_alloc(category_, location_, bytes_);
  }
  ~MetaAllocation() override {
    tracker_.on_free(category_, location_, bytes_);
    if (!real_) space_->release(data_);
  }
  void* data() override { return data_; }
  size_t size_bytes() const override { return bytes_; }

 private:
  std::shared_ptr<AddressSpace> space_;
  size_t bytes_;
  Category category_;
  Location location_;
  MemoryTracker& tracker_;
  std::unique_ptr<char[]> real_;
  void* data_ = nullptr;
};

class MetaStream final : public Stream {
 public:
  explicit MetaStream(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }

 private:
  std::string name_;
};

class MetaEvent final : public Event {};

class MetaDeviceImpl final : public MetaDevice {
 public:
  MetaDeviceImpl(MemoryTracker& tracker, Location location)
      : tracker_(tracker), location_(location), space_(std::make_shared<AddressSpace>()) {}

  DeviceKind kind() const override { return location_.kind; }
  bool holds_values() const override { return false; }
  Location location() const override { return location_; }
  std::string name() const override { return std::string(kDeviceName) + " (" + location_.name() + ")"; }
  MemoryTracker& tracker() override { return tracker_; }

  using Device::allocate_host_staging;
  Buffer allocate(size_t bytes, Category category) override { return make(bytes, category, location_, tracker_); }
  // Host staging is accounted where a real device's would be (pinned host), with the same split
  // between real and unbacked memory.
  Buffer allocate_host_staging(size_t bytes, Category category, MemoryTracker& tracker) override {
    return make(bytes, category, Location::pinned_host(), tracker);
  }

  bool addressable(const void* p, size_t bytes) const override { return !space_->overlaps(p, bytes); }
  void* reserve_unbacked(size_t bytes) override { return space_->reserve(bytes == 0 ? 1 : bytes); }

  Stream& compute_stream() override { return compute_; }
  std::unique_ptr<Stream> create_stream(const std::string& name) override { return std::make_unique<MetaStream>(name); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<MetaEvent>(); }
  void record(Event&, Stream&) override {}
  void wait(Stream&, const Event&) override {}
  void synchronize(const Event&, std::chrono::milliseconds) override {}
  void synchronize(Stream&, std::chrono::milliseconds) override {}

  void copy(void* dst, const void* src, size_t bytes, Stream&) override {
    op_checks::pointer(dst, bytes, kDeviceName, "copy", "dst");
    op_checks::pointer(src, bytes, kDeviceName, "copy", "src");
    if (bytes > 0 && dst != src && real(dst, bytes) && real(src, bytes)) std::memmove(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes, Stream&) override {
    op_checks::pointer(dst, bytes, kDeviceName, "fill_zero", "dst");
    if (bytes > 0 && real(dst, bytes)) std::memset(dst, 0, bytes);
  }
  void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, Stream&) override {
    op_checks::float_dtype(src_dtype, kDeviceName, "convert");
    op_checks::float_dtype(dst_dtype, kDeviceName, "convert");
    const size_t sb = op_checks::bytes_of(n, src_dtype, kDeviceName, "convert");
    const size_t db = op_checks::bytes_of(n, dst_dtype, kDeviceName, "convert");
    if (real(src, sb) && real(dst, db)) host_kernels::convert(src, src_dtype, dst, dst_dtype, n);
  }
  void convert_rows(const void* src, DType src_dtype, size_t src_stride, void* dst, DType dst_dtype, size_t dst_stride,
                    size_t rows, size_t n, Stream&) override {
    op_checks::float_dtype(src_dtype, kDeviceName, "convert_rows");
    op_checks::float_dtype(dst_dtype, kDeviceName, "convert_rows");
    const op_checks::RowExtents e = op_checks::rows(rows, n, src_stride, src_dtype, dst_stride, dst_dtype, kDeviceName);
    if (real(src, e.src_bytes) && real(dst, e.dst_bytes)) {
      host_kernels::convert_rows(src, src_dtype, src_stride, dst, dst_dtype, dst_stride, rows, n);
    }
  }
  void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, Stream&) override {
    op_checks::float_dtype(dst_dtype, kDeviceName, "accumulate");
    op_checks::float_dtype(src_dtype, kDeviceName, "accumulate");
    const size_t db = op_checks::bytes_of(n, dst_dtype, kDeviceName, "accumulate");
    const size_t sb = op_checks::bytes_of(n, src_dtype, kDeviceName, "accumulate");
    if (real(dst, db) && real(src, sb)) host_kernels::accumulate(dst, dst_dtype, src, src_dtype, n);
  }
  void scale(void* x, DType dtype, size_t n, float factor, Stream&) override {
    op_checks::float_dtype(dtype, kDeviceName, "scale");
    if (real(x, op_checks::bytes_of(n, dtype, kDeviceName, "scale"))) host_kernels::scale(x, dtype, n, factor);
  }
  void ordered_sum(const void* ins, DType in_dtype, size_t stride, int k, void* out, DType out_dtype, size_t n,
                   Stream&) override {
    op_checks::float_dtype(in_dtype, kDeviceName, "ordered_sum");
    op_checks::float_dtype(out_dtype, kDeviceName, "ordered_sum");
    op_checks::ordered_sum(k, stride, n, in_dtype, kDeviceName);
    const size_t in_bytes = ((static_cast<size_t>(k) - 1) * stride + n) * dtype_size(in_dtype);
    if (real(ins, in_bytes) && real(out, n * dtype_size(out_dtype))) {
      host_kernels::ordered_sum(ins, in_dtype, stride, k, out, out_dtype, n);
    }
  }
  void block_sum_of_squares(const void* x, DType dtype, size_t block, size_t blocks, double* out,
                            Stream&) override {
    op_checks::float_dtype(dtype, kDeviceName, "block_sum_of_squares");
    size_t n = 0;
    if (__builtin_mul_overflow(block, blocks, &n)) {
      ZERO_THROW(InvalidArgument, "{} block_sum_of_squares: {} blocks of {} overflow", kDeviceName, blocks, block);
    }
    if (real(x, n * dtype_size(dtype)) && real(out, blocks * sizeof(double))) {
      host_kernels::block_sum_of_squares(x, dtype, block, blocks, out);
    }
  }
  void quantize_blocks(const void* src, DType src_dtype, size_t n, const BlockQuantization& q, void* segment,
                       uint64_t* nonfinite, Stream&) override {
    const op_checks::QuantizedExtents e =
        op_checks::quantized(1, n, q, 0, src_dtype, 0, kDeviceName, "quantize_blocks");
    if (real(src, e.element_bytes) && real(segment, e.segment_bytes)) {
      const uint64_t bad = host_kernels::quantize_blocks(src, src_dtype, n, q, segment);
      if (nonfinite != nullptr && real(nonfinite, sizeof(uint64_t))) *nonfinite += bad;
    }
  }
  void dequantize_rows(const void* segments, size_t segment_stride, size_t rows, size_t n, const BlockQuantization& q,
                       void* dst, DType dst_dtype, size_t dst_stride, Stream&) override {
    const op_checks::QuantizedExtents e =
        op_checks::quantized(rows, n, q, segment_stride, dst_dtype, dst_stride, kDeviceName, "dequantize_rows");
    if (real(segments, e.segment_bytes) && real(dst, e.element_bytes)) {
      host_kernels::dequantize_rows(segments, segment_stride, rows, n, q, dst, dst_dtype, dst_stride);
    }
  }
  void host_task(Stream&, std::function<void()> fn) override {
    ZERO_CHECK(fn != nullptr, "host_task needs a function");
    fn();
  }
  void* native_handle(Stream&) override { return nullptr; }

 private:
  bool real(const void* p, size_t bytes) const { return addressable(p, bytes); }
  Buffer make(size_t bytes, Category category, Location location, MemoryTracker& tracker) {
    if (bytes == 0) return Buffer(nullptr, location, category);
    return Buffer(std::make_unique<MetaAllocation>(space_, bytes, category, location, tracker), location, category);
  }

  MemoryTracker& tracker_;
  Location location_;
  std::shared_ptr<AddressSpace> space_;
  MetaStream compute_{"compute"};
};

}  // namespace

std::unique_ptr<MetaDevice> make_meta_device(MemoryTracker& tracker, Location location) {
  ZERO_CHECK(location.kind != DeviceKind::kPinnedHost, "a meta device stands for a host or a CUDA device");
  return std::make_unique<MetaDeviceImpl>(tracker, location);
}

}  // namespace zero::memory
