#pragma once
// How updated parameters reach every rank's parameter storage after the optimizer wrote its owned
// range of a bucket (in the model dtype):
//   local   the rank owns the whole bucket (stage 0): copy it into the parameters;
//   gather  the rank owns one chunk (stages 1, 2): all-gather the bucket within the shard group,
//           double-buffered so one bucket's all-gather overlaps the next bucket's update, then copy.
// Stage 3 adds a third (write the 16-bit shard) without touching the update.
#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "memory/device.h"
#include "zero/collective_order.h"
#include "zero/shard_layout.h"

namespace zero {

class ParamWriteback {
 public:
  virtual ~ParamWriteback() = default;
  // Where the optimizer writes bucket b (model dtype, indexed from the bucket's flat start; only the
  // owned range is written). Valid until publish(b).
  virtual void* bucket_out(size_t b) = 0;
  // Bucket b's owned range is written (on the compute stream).
  virtual void publish(size_t b) = 0;
  // Every published bucket has reached the parameters (in compute-stream order).
  virtual void finish() = 0;
};

struct WritebackTarget {
  const ShardLayout* layout = nullptr;
  std::vector<void*> tensor_data;  // each trainable tensor's parameter storage (model dtype)
  DType model_dtype = DType::kFloat32;
};

std::unique_ptr<ParamWriteback> make_local_writeback(memory::Device& device, WritebackTarget target);
std::unique_ptr<ParamWriteback> make_gather_writeback(memory::Device& device, WritebackTarget target,
                                                      comm::Communicator& shard_comm,
                                                      std::chrono::milliseconds timeout);

}  // namespace zero
