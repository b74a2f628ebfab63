#include "parallel/pipeline/schedule.h"

#include <fmt/format.h>

namespace zero::parallel {

const char* op_name(Op op) {
  switch (op) {
    case Op::kF: return "F";
    case Op::kB: return "B";
    case Op::kW: return "W";
    case Op::kBW: return "BW";
    case Op::kSendF: return "SendF";
    case Op::kRecvF: return "RecvF";
    case Op::kSendB: return "SendB";
    case Op::kRecvB: return "RecvB";
  }
  return "?";
}

bool is_compute(Op op) { return op == Op::kF || op == Op::kB || op == Op::kW || op == Op::kBW; }
bool is_transfer(Op op) { return !is_compute(op); }
bool is_receive(Op op) { return op == Op::kRecvF || op == Op::kRecvB; }

std::string describe(const Action& a, int chunks) {
  return chunks > 1 ? fmt::format("{}{}c{}", op_name(a.op), a.mb, a.chunk) : fmt::format("{}{}", op_name(a.op), a.mb);
}

int Schedule::peer(int rank, const Action& t) const {
  const int k = virtual_stage(rank, t.chunk);
  const bool next = t.op == Op::kSendF || t.op == Op::kRecvB;
  return rank_of(next ? k + 1 : k - 1);
}

bool Schedule::sends_forward(int rank, int chunk) const {
  const int k = virtual_stage(rank, chunk);
  return k + 1 < virtual_stages() && rank_of(k + 1) != rank;
}

bool Schedule::receives_forward(int rank, int chunk) const {
  const int k = virtual_stage(rank, chunk);
  return k > 0 && rank_of(k - 1) != rank;
}

}  // namespace zero::parallel
