#include "comm/gloo/gloo_scratch_plan.h"

#include <algorithm>

#include "base/check.h"
#include "comm/gloo/gloo_collectives.h"

namespace zero::comm {

GlooScratchPlan::GlooScratchPlan(const GlooOptions& options, int size, int rank)
    : options_(options), size_(size), rank_(rank) {
  options_.validate();
  ZERO_CHECK(size >= 1 && rank >= 0 && rank < size, "GlooScratchPlan: rank {} of {}", rank, size);
}

void GlooScratchPlan::add_call(CollectiveKind kind, size_t count, DType dtype) {
  const size_t es = dtype_size(dtype);
  const uint64_t area = static_cast<uint64_t>(size_) * message_capacity(options_);
  const bool small = kind == CollectiveKind::kBarrier || runs_as_messages(options_, count * es);
  messages_ = std::max(messages_, area);  // every call's receive area (GlooCallRunner::run)
  if (size_ > 1 && (small || options_.check_schedule)) message_sends_ = std::max(message_sends_, area);
  const bool reduces = kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter;
  if (size_ > 1 && !small && reduces) {
    const size_t mine = kind == CollectiveKind::kAllReduce ? ChunkLayout::balanced(count, size_).count[static_cast<size_t>(rank_)] : count;
    DirectOptions d;
    d.segment_bytes = options_.segment_bytes;
    d.depth = options_.segment_depth;
    scratch_ = std::max<uint64_t>(scratch_, reduce_scatter_segments(mine, es, d).scratch_bytes(size_, es));
  }
}

}  // namespace zero::comm
