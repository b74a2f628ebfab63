#include "zero/shard_layout.h"

#include <algorithm>
#include <set>

#include "base/check.h"

namespace zero {
namespace {

size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

}  // namespace

ShardLayout::ShardLayout(const std::vector<size_t>& tensor_numels, int world_size,
                         const ShardLayoutOptions& options, const std::vector<int>& tensor_units,
                         const std::vector<bool>& starts_block, const std::vector<DType>& tensor_dtypes,
                         const std::vector<bool>& whole_in_bucket)
    : world_size_(world_size), options_(options) {
  if (world_size < 1) ZERO_THROW(InvalidArgument, "ShardLayout: world_size must be >= 1, got {}", world_size);
  if (options.alignment == 0) ZERO_THROW(InvalidArgument, "ShardLayoutOptions.alignment must be > 0");
  if (options.block == 0 || options.block % options.alignment != 0) {
    ZERO_THROW(InvalidArgument,
               "ShardLayoutOptions.block ({}) must be a positive multiple of alignment ({})",
               options.block, options.alignment);
  }
  if (options.bucket_numel == 0) ZERO_THROW(InvalidArgument, "ShardLayoutOptions.bucket_numel must be > 0");
  if (!tensor_units.empty() && tensor_units.size() != tensor_numels.size()) {
    ZERO_THROW(InvalidArgument, "ShardLayout: {} tensor units for {} tensors", tensor_units.size(),
               tensor_numels.size());
  }
  if (options.unit_buckets && tensor_units.empty()) {
    ZERO_THROW(InvalidArgument, "ShardLayoutOptions.unit_buckets needs each tensor's unit");
  }
  const size_t quantum = static_cast<size_t>(world_size) * options.block;
  if (!starts_block.empty() && starts_block.size() != tensor_numels.size()) {
    ZERO_THROW(InvalidArgument, "ShardLayout: {} block starts for {} tensors", starts_block.size(),
               tensor_numels.size());
  }
  if (!tensor_dtypes.empty() && tensor_dtypes.size() != tensor_numels.size()) {
    ZERO_THROW(InvalidArgument, "ShardLayout: {} tensor dtypes for {} tensors", tensor_dtypes.size(),
               tensor_numels.size());
  }
  auto unit_of = [&](size_t t) { return tensor_units.empty() ? 0 : tensor_units[t]; };
  auto own_block = [&](size_t t) { return !starts_block.empty() && starts_block[t]; };
  // Whether tensor t's dtype differs from the one before it: it starts a bucket (the top comment).
  auto new_dtype = [&](size_t t) { return !tensor_dtypes.empty() && t > 0 && tensor_dtypes[t] != tensor_dtypes[t - 1]; };
  std::set<int> finished_units;
  for (size_t t = 0; t < tensor_numels.size(); ++t) {
    if (tensor_numels[t] == 0) ZERO_THROW(InvalidArgument, "ShardLayout: tensor {} has zero elements", t);
    if (t > 0 && unit_of(t) != unit_of(t - 1)) {
      finished_units.insert(unit_of(t - 1));
      if (finished_units.count(unit_of(t))) {
        ZERO_THROW(InvalidArgument, "ShardLayout: the tensors of unit {} are not consecutive (tensor {})",
                   unit_of(t), t);
      }
    }
  }

  if (options.whole_tensors) {
    lay_out_whole_tensors(tensor_numels, tensor_units, tensor_dtypes);
    set_dtypes(tensor_dtypes);
    return;
  }
  if (!whole_in_bucket.empty() && whole_in_bucket.size() != tensor_numels.size()) {
    ZERO_THROW(InvalidArgument, "ShardLayout: {} whole-in-bucket marks for {} tensors", whole_in_bucket.size(),
               tensor_numels.size());
  }
  if (options.whole_tensor_buckets && !options.unit_buckets) {
    lay_out_tensor_buckets(tensor_numels, tensor_dtypes, whole_in_bucket);
    set_dtypes(tensor_dtypes);
    return;
  }
  if (options.unit_buckets) {
    // One padded bucket per unit (per dtype of the unit), back to back.
    size_t offset = 0, shard_offset = 0;
    for (size_t t = 0; t < tensor_numels.size();) {
      Bucket b;
      b.offset = offset;
      b.first_tensor = t;
      b.unit = unit_of(t);
      size_t end = offset;
      for (; t < tensor_numels.size() && unit_of(t) == b.unit && (t == b.first_tensor || !new_dtype(t)); ++t) {
        // With whole-tensor buckets every tensor starts on a block (see lay_out_tensor_buckets).
        const bool block_start = own_block(t) || options.whole_tensor_buckets;
        end = round_up(end, block_start ? options.block : options.alignment);
        tensors_.push_back({tensor_numels[t], end});
        end += tensor_numels[t];
      }
      b.end_tensor = t;
      b.numel = end - offset;
      b.padded = round_up(b.numel, quantum);
      b.chunk = b.padded / world_size;
      b.shard_offset = shard_offset;
      shard_offset += b.chunk;
      offset += b.padded;
      buckets_.push_back(b);
    }
    total_numel_ = tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().numel;
    padded_numel_ = offset;
    set_dtypes(tensor_dtypes);
    return;
  }

  // Segments of one dtype (the whole model when there is one), each cut into buckets of exactly
  // `capacity` but its last, so that padding sits only at a segment's end.
  const size_t capacity = round_up(options.bucket_numel, quantum);
  tensors_.reserve(tensor_numels.size());
  size_t shard_offset = 0;
  for (size_t first = 0; first < tensor_numels.size();) {
    const size_t segment = padded_numel_;
    size_t offset = segment;
    size_t end = first;
    for (; end < tensor_numels.size() && (end == first || !new_dtype(end)); ++end) {
      const bool new_unit = end > 0 && unit_of(end) != unit_of(end - 1);
      offset = round_up(offset, new_unit || own_block(end) ? options.block : options.alignment);
      tensors_.push_back({tensor_numels[end], offset});
      offset += tensor_numels[end];
    }
    total_numel_ = offset;
    size_t t = first;
    for (size_t start = segment; start < offset; start += capacity) {
      Bucket b;
      b.offset = start;
      b.numel = std::min(capacity, offset - start);
      b.padded = round_up(b.numel, quantum);
      b.chunk = b.padded / world_size;
      b.shard_offset = shard_offset;
      shard_offset += b.chunk;
      // Tensors overlapping [start, start + numel).
      while (t < end && tensors_[t].offset + tensors_[t].numel <= start) ++t;
      b.first_tensor = t;
      size_t e = t;
      while (e < end && tensors_[e].offset < start + b.numel) ++e;
      b.end_tensor = e;
      buckets_.push_back(b);
      padded_numel_ += b.padded;
    }
    first = end;
  }
  set_dtypes(tensor_dtypes);
}

void ShardLayout::lay_out_tensor_buckets(const std::vector<size_t>& tensor_numels,
                                         const std::vector<DType>& tensor_dtypes,
                                         const std::vector<bool>& whole_in_bucket) {
  const size_t block = options_.block;
  const size_t quantum = static_cast<size_t>(world_size_) * block;
  const size_t capacity = round_up(options_.bucket_numel, quantum);
  auto whole = [&](size_t t) { return whole_in_bucket.empty() || whole_in_bucket[t]; };
  size_t shard_offset = 0;
  Bucket b;  // the open bucket: from b.offset, its data up to `end`
  size_t end = 0;
  // Closes the open bucket at `end` (padded) and opens the next after it, from tensor `next`.
  auto close = [&](size_t next, size_t last_end) {
    b.numel = end - b.offset;
    b.padded = round_up(b.numel, quantum);
    b.chunk = b.padded / static_cast<size_t>(world_size_);
    b.shard_offset = shard_offset;
    b.end_tensor = last_end;
    shard_offset += b.chunk;
    padded_numel_ += b.padded;
    buckets_.push_back(b);
    b = Bucket{};
    b.offset = buckets_.back().offset + buckets_.back().padded;
    b.first_tensor = next;
    end = b.offset;
  };
  tensors_.reserve(tensor_numels.size());
  for (size_t t = 0; t < tensor_numels.size(); ++t) {
    const bool new_dtype = !tensor_dtypes.empty() && t > 0 && tensor_dtypes[t] != tensor_dtypes[t - 1];
    // A new bucket for a dtype of its own, for a whole tensor that would cross the cut, and for any
    // tensor when the bucket is full already (a whole tensor larger than the capacity filled it):
    // cuts fall inside the unmarked tensor being placed, never inside an earlier one.
    const size_t start = round_up(end, block);
    if (t > b.first_tensor &&
        (new_dtype || start - b.offset >= capacity || (whole(t) && start + tensor_numels[t] - b.offset > capacity))) {
      close(t, t);
    }
    const size_t at = round_up(end, block);
    tensors_.push_back({tensor_numels[t], at});
    end = at + tensor_numels[t];
    // An unmarked tensor is cut wherever the bucket fills (at a multiple of the quantum: no padding).
    while (!whole(t) && end - b.offset > capacity) {
      const size_t stop = end;
      end = b.offset + capacity;
      close(t, t + 1);
      end = stop;
    }
  }
  if (!tensor_numels.empty()) close(tensor_numels.size(), tensor_numels.size());
  total_numel_ = tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().numel;
}

void ShardLayout::set_dtypes(const std::vector<DType>& tensor_dtypes) {
  for (size_t t = 0; t < tensor_dtypes.size(); ++t) tensors_[t].dtype = tensor_dtypes[t];
  for (Bucket& b : buckets_) {
    if (b.first_tensor < b.end_tensor) b.dtype = tensors_[b.first_tensor].dtype;
    for (size_t t = b.first_tensor; t < b.end_tensor; ++t) ZERO_CHECK(tensors_[t].dtype == b.dtype, "a bucket mixes dtypes");
    b.bytes = padded_bytes_;
    b.shard_bytes = shard_bytes_;
    padded_bytes_ += b.padded * dtype_size(b.dtype);
    shard_bytes_ += b.chunk * dtype_size(b.dtype);
    mixed_dtypes_ = mixed_dtypes_ || b.dtype != buckets_.front().dtype;
  }
}

namespace {

// The smallest largest-run (in blocks) when `blocks`, in order, are cut into at most `runs`
// consecutive runs; each run's start index goes to `starts`.
size_t balanced_runs(const std::vector<size_t>& blocks, size_t runs, std::vector<size_t>& starts) {
  auto cut = [&](size_t cap, std::vector<size_t>* out) {
    size_t used = 0, sum = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (i == 0 || sum + blocks[i] > cap) {
        ++used;
        sum = 0;
        if (out != nullptr) out->push_back(i);
      }
      sum += blocks[i];
    }
    return used;
  };
  size_t lo = *std::max_element(blocks.begin(), blocks.end()), hi = 0;
  for (size_t b : blocks) hi += b;
  while (lo < hi) {  // the least cap that needs no more than `runs` runs
    const size_t mid = lo + (hi - lo) / 2;
    if (cut(mid, nullptr) <= runs) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  starts.clear();
  cut(lo, &starts);
  return lo;
}

}  // namespace

void ShardLayout::lay_out_whole_tensors(const std::vector<size_t>& tensor_numels, const std::vector<int>& tensor_units,
                                        const std::vector<DType>& tensor_dtypes) {
  const size_t block = options_.block;
  const size_t world = static_cast<size_t>(world_size_);
  auto unit_of = [&](size_t t) { return tensor_units.empty() ? 0 : tensor_units[t]; };
  auto blocks_of = [&](size_t t) { return round_up(tensor_numels[t], block) / block; };
  size_t offset = 0, shard_offset = 0;
  tensors_.resize(tensor_numels.size());
  for (size_t t = 0; t < tensor_numels.size();) {
    // The bucket's tensors: the unit's; or consecutive ones until they reach bucket_numel and
    // world_size times the largest of them, so that world_size runs of them can be near equal (a
    // bucket of one large tensor would leave every other rank's chunk all padding). Larger buckets
    // pad less but cost more buffer memory: at 2 x world_size x the largest, GPT-2 XL's shape at 8
    // ranks pads as much (5.3%) and its bucket buffers double (zero_plan --whole-tensors).
    size_t end = t + 1, numel = blocks_of(t) * block, largest = numel;
    auto more = [&] {
      if (!tensor_dtypes.empty() && tensor_dtypes[end] != tensor_dtypes[t]) return false;
      if (options_.unit_buckets) return unit_of(end) == unit_of(t);
      return numel < options_.bucket_numel || numel < world * largest;
    };
    while (end < tensor_numels.size() && more()) {
      numel += blocks_of(end) * block;
      largest = std::max(largest, blocks_of(end) * block);
      ++end;
    }
    std::vector<size_t> blocks;
    for (size_t i = t; i < end; ++i) blocks.push_back(blocks_of(i));
    std::vector<size_t> starts;
    const size_t chunk = balanced_runs(blocks, world, starts) * block;
    Bucket b;
    b.offset = offset;
    b.first_tensor = t;
    b.end_tensor = end;
    b.unit = options_.unit_buckets ? unit_of(t) : -1;
    b.padded = chunk * world;
    b.chunk = chunk;
    b.shard_offset = shard_offset;
    starts.push_back(blocks.size());
    for (size_t r = 0; r + 1 < starts.size(); ++r) {
      size_t at = offset + r * chunk;
      for (size_t i = starts[r]; i < starts[r + 1]; ++i) {
        tensors_[t + i] = {tensor_numels[t + i], at};
        at += blocks[i] * block;
      }
    }
    b.numel = tensors_[end - 1].offset + tensors_[end - 1].numel - offset;
    buckets_.push_back(b);
    shard_offset += chunk;
    offset += b.padded;
    t = end;
  }
  total_numel_ = tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().numel;
  padded_numel_ = offset;
}

size_t ShardLayout::max_bucket_padded() const {
  size_t m = 0;
  for (const Bucket& b : buckets_) m = std::max(m, b.padded);
  return m;
}

size_t ShardLayout::max_bucket_bytes() const {
  size_t m = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) m = std::max(m, bucket_bytes(b));
  return m;
}

size_t ShardLayout::flat_bytes(size_t b, size_t flat) const {
  const Bucket& B = buckets_[b];
  ZERO_CHECK(flat >= B.offset && flat <= B.offset + B.padded, "flat offset {} outside bucket {}", flat, b);
  return B.bytes + (flat - B.offset) * dtype_size(B.dtype);
}

size_t ShardLayout::shard_bytes(size_t b, size_t shard) const {
  const Bucket& B = buckets_[b];
  ZERO_CHECK(shard >= B.shard_offset && shard <= B.shard_offset + B.chunk, "shard offset {} outside bucket {}", shard, b);
  return B.shard_bytes + (shard - B.shard_offset) * dtype_size(B.dtype);
}

size_t ShardLayout::chunk_begin(size_t bucket, int rank) const {
  ZERO_CHECK_LT(bucket, buckets_.size());
  ZERO_CHECK(rank >= 0 && rank < world_size_, "rank {} of {}", rank, world_size_);
  const Bucket& b = buckets_[bucket];
  return b.offset + static_cast<size_t>(rank) * b.chunk;
}

std::vector<ShardLayout::Piece> ShardLayout::pieces(int rank) const {
  std::vector<Piece> out;
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    const Bucket& b = buckets_[bi];
    const size_t lo = chunk_begin(bi, rank);
    const size_t hi = lo + b.chunk;
    for (size_t t = b.first_tensor; t < b.end_tensor; ++t) {
      const size_t ts = tensors_[t].offset;
      const size_t te = ts + tensors_[t].numel;
      const size_t s = std::max(ts, lo);
      const size_t e = std::min(te, hi);
      if (s >= e) continue;
      out.push_back({t, s - ts, e - ts, b.shard_offset + (s - lo), bi});
    }
  }
  return out;
}

size_t ShardLayout::bucket_of(size_t flat) const {
  ZERO_CHECK_LT(flat, padded_numel_, "flat offset out of range");
  // The last bucket starting at or before `flat` (buckets are contiguous and padded).
  const auto it = std::upper_bound(buckets_.begin(), buckets_.end(), flat,
                                   [](size_t f, const Bucket& b) { return f < b.offset; });
  return static_cast<size_t>(it - buckets_.begin()) - 1;
}

std::pair<size_t, size_t> ShardLayout::buckets_of_tensor(size_t t) const {
  ZERO_CHECK_LT(t, tensors_.size());
  const size_t first = bucket_of(tensors_[t].offset);
  const size_t last = bucket_of(tensors_[t].offset + tensors_[t].numel - 1);
  return {first, last};
}

std::string ShardLayout::describe() const {
  std::string s = fmt::format("ShardLayout: {} tensors, {} elements ({} padded), world {}, {} buckets\n",
                              tensors_.size(), total_numel_, padded_numel_, world_size_, buckets_.size());
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    s += fmt::format("  bucket {}: flat [{}, {}) padded {} chunk {} tensors [{}, {}){}\n", i, b.offset,
                     b.offset + b.numel, b.padded, b.chunk, b.first_tensor, b.end_tensor,
                     mixed_dtypes_ ? fmt::format(" {}", dtype_name(b.dtype)) : "");
  }
  return s;
}

}  // namespace zero
