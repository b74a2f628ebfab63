#pragma once
// Internal to the shard optimizers: a walk over an optimizer's runs (element ranges [begin, end) of
// its space, sorted by begin and disjoint: each kind's pieces of segments) that overlap a range.
#include <algorithm>
#include <cstddef>
#include <vector>

namespace zero {

// fn(run, lo, hi) for each run of `runs` overlapping [begin, end), [lo, hi) being the overlap.
template <typename Run, typename Fn>
void for_each_overlap(const std::vector<Run>& runs, size_t begin, size_t end, Fn&& fn) {
  auto r = std::partition_point(runs.begin(), runs.end(), [&](const Run& x) { return x.end <= begin; });
  for (; r != runs.end() && r->begin < end; ++r) fn(*r, std::max(r->begin, begin), std::min(r->end, end));
}

}  // namespace zero
