#pragma once
// How updated parameters reach every rank's parameter storage after the optimizer wrote its owned
// range of a bucket (in the bucket's dtype, ShardLayout::Bucket::dtype):
//   local   the rank owns the whole bucket (stage 0): copy it into the parameters;
//   gather  the rank owns one chunk (stages 1, 2): all-gather the bucket within the shard group,
//           double-buffered so one bucket's all-gather overlaps the next bucket's update, then copy.
//   shard   stage 3: the new values go straight into the rank's parameter shard, which the
//           ParamGatherer all-gathers when a unit is next used.
#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "memory/device.h"
#include "zero/collective_order.h"
#include "zero/shard_layout.h"
#include "zero/shard_ownership.h"
#include "zero/step_timings.h"

namespace zero {

class ParamWriteback {
 public:
  virtual ~ParamWriteback() = default;
  // Where the optimizer writes the new values of bucket b's owned range `own` (the bucket's dtype,
  // its first element). Valid until publish(b).
  virtual void* owned_out(size_t b, const OwnedRange& own) = 0;
  // Bucket b's owned range is written (on the compute stream).
  virtual void publish(size_t b) = 0;
  // Every published bucket has reached the parameters (in compute-stream order).
  virtual void finish() = 0;
};

struct WritebackTarget {
  const ShardLayout* layout = nullptr;
  std::vector<void*> tensor_data;  // each trainable tensor's parameter storage (its layout dtype)
};

std::unique_ptr<ParamWriteback> make_local_writeback(memory::Device& device, WritebackTarget target);
// `shard`: the rank's parameter shard in optimizer-space order (ParamGatherer::shard()).
std::unique_ptr<ParamWriteback> make_shard_writeback(void* shard, const ShardLayout& layout);
// `timings` (optional) counts the all-gathered bytes.
std::unique_ptr<ParamWriteback> make_gather_writeback(memory::Device& device, WritebackTarget target,
                                                      comm::Communicator& shard_comm,
                                                      std::chrono::milliseconds timeout,
                                                      StepTimings* timings = nullptr);

}  // namespace zero
