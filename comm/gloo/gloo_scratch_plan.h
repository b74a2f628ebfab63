#pragma once
// What a Gloo communicator's scratch memory grows to, for the planner (zero/plan/).
#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "comm/gloo/gloo_options.h"
#include "comm/schedule_check.h"

namespace zero::comm {

// What a Gloo communicator's scratch memory (accounted process-wide, category comm_buffer) grows to
// over a sequence of calls: the message areas every call uses and the reduce-scatter's receive
// segments, each buffer kept at its largest need. The planner's account of it (zero/plan/), from
// the sizing functions the communicator itself uses.
class GlooScratchPlan {
 public:
  GlooScratchPlan(const GlooOptions& options, int size, int rank);
  // One call; `count` as the Communicator method takes it (all_gather: send_count, ...).
  void add_call(CollectiveKind kind, size_t count, DType dtype);
  uint64_t bytes() const { return messages_ + message_sends_ + scratch_; }

 private:
  GlooOptions options_;
  int size_, rank_;
  uint64_t messages_ = 0, message_sends_ = 0, scratch_ = 0;
};

}  // namespace zero::comm
