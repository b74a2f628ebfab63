#include "comm/communicator.h"

#include <limits>

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

WorkHandle Communicator::send(const void*, size_t, DType, int) {
  ZERO_THROW(InvalidArgument, "send is not supported by the {} communicator", backend_name());
}

WorkHandle Communicator::recv(void*, size_t, DType, int) {
  ZERO_THROW(InvalidArgument, "recv is not supported by the {} communicator", backend_name());
}

size_t check_p2p_args(const char* op, const void* buf, size_t count, DType dtype, int peer,
                      int rank, int size) {
  if (peer < 0 || peer >= size) {
    ZERO_THROW(InvalidArgument, "{}: peer {} is out of range [0, {}) (rank {})", op, peer, size,
               rank);
  }
  if (peer == rank) {
    ZERO_THROW(InvalidArgument, "{}: peer {} is this rank itself (point-to-point needs another rank)",
               op, peer);
  }
  const size_t es = dtype_size(dtype);
  if (count > std::numeric_limits<size_t>::max() / es) {
    ZERO_THROW(InvalidArgument, "{}: buf of {} elements overflows the address space", op, count);
  }
  if (buf == nullptr && count > 0) {
    ZERO_THROW(InvalidArgument, "{}: buf is null with count {}", op, count);
  }
  return count * es;
}

}  // namespace zero::comm
