#include "zero/tp_placement.h"

#include <algorithm>
#include <functional>
#include <numeric>

#include <fmt/format.h>

#include "base/check.h"

namespace zero {
namespace {

// A split tensor seen as [outer, blocks, tp, piece, inner]: rank r's part is [outer, blocks, piece,
// inner] taken at index r of the tp axis.
struct SplitView {
  size_t outer = 1, blocks = 1, piece = 0, inner = 1;
};

SplitView view(const std::vector<int64_t>& shape, const TpPlacement& p, int tp) {
  SplitView v;
  const auto dim = static_cast<size_t>(p.dim);
  for (size_t i = 0; i < dim; ++i) v.outer *= static_cast<size_t>(shape[i]);
  for (size_t i = dim + 1; i < shape.size(); ++i) v.inner *= static_cast<size_t>(shape[i]);
  v.blocks = static_cast<size_t>(p.blocks);
  v.piece = static_cast<size_t>(shape[dim]) / v.blocks / static_cast<size_t>(tp);
  return v;
}

size_t elements(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), size_t{1},
                         [](size_t a, int64_t d) { return a * static_cast<size_t>(d); });
}

// Calls copy(full_offset, local_offset, count) for every contiguous run of rank r's part.
template <typename Copy>
void for_each_run(const std::vector<int64_t>& shape, const TpPlacement& p, int r, int tp, Copy copy) {
  if (!p.is_split()) {
    copy(size_t{0}, size_t{0}, elements(shape));
    return;
  }
  const SplitView v = view(shape, p, tp);
  const size_t run = v.piece * v.inner;
  const size_t dim_len = v.blocks * static_cast<size_t>(tp) * v.piece;
  size_t local = 0;
  for (size_t o = 0; o < v.outer; ++o) {
    for (size_t b = 0; b < v.blocks; ++b) {
      const size_t row = b * static_cast<size_t>(tp) * v.piece + static_cast<size_t>(r) * v.piece;
      copy((o * dim_len + row) * v.inner, local, run);
      local += run;
    }
  }
}

}  // namespace

std::string describe(const TpPlacement& p) {
  if (!p.is_split()) return p.partial_grad ? "replicated (partial gradients)" : "replicated";
  if (p.blocks == 1) return fmt::format("split({})", p.dim);
  return fmt::format("split({}, {} blocks)", p.dim, p.blocks);
}

void check_local(const std::string& name, const std::vector<int64_t>& local, const TpPlacement& p) {
  if (!p.is_split()) return;
  if (p.partial_grad) {
    ZERO_THROW(InvalidArgument, "parameter '{}': partial gradients are for replicated parameters, not {}", name,
               describe(p));
  }
  if (p.dim < 0 || static_cast<size_t>(p.dim) >= local.size()) {
    ZERO_THROW(InvalidArgument, "parameter '{}': placement {} but the tensor has {} dimension(s)", name,
               describe(p), local.size());
  }
  if (p.blocks < 1) {
    ZERO_THROW(InvalidArgument, "parameter '{}': placement {} needs a positive number of blocks", name,
               describe(p));
  }
  if (local[static_cast<size_t>(p.dim)] % p.blocks != 0) {
    ZERO_THROW(InvalidArgument, "parameter '{}': placement {} but its part's dimension {} has size {}", name,
               describe(p), p.dim, local[static_cast<size_t>(p.dim)]);
  }
}

std::vector<int64_t> full_shape(const std::vector<int64_t>& local, const TpPlacement& p, int tp) {
  std::vector<int64_t> full = local;
  if (p.is_split()) full[static_cast<size_t>(p.dim)] *= tp;
  return full;
}

std::vector<int64_t> local_shape(const std::string& name, const std::vector<int64_t>& shape,
                                 const TpPlacement& p, int tp) {
  if (tp < 1) ZERO_THROW(InvalidArgument, "parameter '{}': tp {} is not positive", name, tp);
  if (!p.is_split()) return shape;
  if (p.dim < 0 || static_cast<size_t>(p.dim) >= shape.size()) {
    ZERO_THROW(InvalidArgument, "parameter '{}': placement {} but the tensor has {} dimension(s)", name,
               describe(p), shape.size());
  }
  if (p.blocks < 1) {
    ZERO_THROW(InvalidArgument, "parameter '{}': placement {} needs a positive number of blocks", name,
               describe(p));
  }
  const int64_t len = shape[static_cast<size_t>(p.dim)];
  const int64_t parts = static_cast<int64_t>(p.blocks) * tp;
  if (len % parts != 0) {
    ZERO_THROW(InvalidArgument,
               "parameter '{}': dimension {} has size {}, which does not divide into {} block(s) x "
               "tp {} (placement {})",
               name, p.dim, len, p.blocks, tp, describe(p));
  }
  std::vector<int64_t> local = shape;
  local[static_cast<size_t>(p.dim)] = len / tp;
  return local;
}

void shard(const float* full, const std::vector<int64_t>& shape, const TpPlacement& p, int r, int tp,
           float* local) {
  local_shape("shard", shape, p, tp);  // validates
  if (r < 0 || r >= tp) ZERO_THROW(InvalidArgument, "shard: tp rank {} is outside [0, {})", r, tp);
  for_each_run(shape, p, r, tp, [&](size_t f, size_t l, size_t n) { std::copy_n(full + f, n, local + l); });
}

void unshard(const float* local, const std::vector<int64_t>& shape, const TpPlacement& p, int r, int tp,
             float* full) {
  local_shape("unshard", shape, p, tp);
  if (r < 0 || r >= tp) ZERO_THROW(InvalidArgument, "unshard: tp rank {} is outside [0, {})", r, tp);
  for_each_run(shape, p, r, tp, [&](size_t f, size_t l, size_t n) { std::copy_n(local + l, n, full + f); });
}

namespace {

// A split tensor seen as [rows, tp, run]: rank r's part is [rows, run] at index r of the tp axis
// (rows = outer x blocks, run = piece x inner). Both directions are division by `run`.
size_t run_length(const std::vector<int64_t>& shape, const TpPlacement& p, int tp) {
  local_shape("tp runs", shape, p, tp);  // validates
  const SplitView v = view(shape, p, tp);
  return v.piece * v.inner;
}

}  // namespace

std::vector<TpRun> part_runs(const std::vector<int64_t>& shape, const TpPlacement& p, int r, int tp, size_t begin,
                             size_t end) {
  if (!p.is_split() || tp == 1) return {{r, begin, begin, end - begin}};
  const size_t run = run_length(shape, p, tp), t = static_cast<size_t>(tp), rr = static_cast<size_t>(r);
  std::vector<TpRun> out;
  for (size_t l = begin; l < end;) {
    const size_t k = l / run, within = l % run, n = std::min(end - l, run - within);
    out.push_back({r, l, (k * t + rr) * run + within, n});
    l += n;
  }
  return out;
}

std::vector<TpRun> whole_runs(const std::vector<int64_t>& shape, const TpPlacement& p, int tp, size_t begin,
                              size_t end) {
  if (!p.is_split() || tp == 1) return {{0, begin, begin, end - begin}};
  const size_t run = run_length(shape, p, tp), t = static_cast<size_t>(tp);
  std::vector<TpRun> out;
  for (size_t g = begin; g < end;) {
    const size_t q = g / run, within = g % run, n = std::min(end - g, run - within);
    out.push_back({static_cast<int>(q % t), (q / t) * run + within, g, n});
    g += n;
  }
  return out;
}

}  // namespace zero
