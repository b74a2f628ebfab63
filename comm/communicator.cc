#include "comm/communicator.h"

#include "base/check.h"

namespace zero::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "unknown";
}

ReduceOp parse_reduce_op(std::string_view name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    if (name == reduce_op_name(op)) return op;
  }
  ZERO_THROW(InvalidArgument, "unknown reduce op '{}' (expected sum, avg, max or min)", name);
}

}  // namespace zero::comm
