#pragma once
// A pipeline schedule as data (torch.distributed.pipelining's shape): for every pipeline rank, the
// ordered list of what it does in one step. Data can be checked (pipeline_check.h), simulated
// (schedule_sim.h), drawn (timeline_svg.h) and executed (the runner), and a schedule written by hand
// goes through the same checks as a generated one (schedules.h).
//
// The model is cut into p x v chunks, "virtual stages" k = 0 .. p*v - 1 in model order. Where they
// lie (Placement): in a loop, rank s holds chunks c = 0 .. v-1, chunk c being virtual stage c*p + s
// (Megatron's interleaving: with v = 1 rank s is stage s); in a V (v = 2, zero-bubble ZB-V), rank s
// holds virtual stages s and 2p-1-s, so rank 0 holds the first and the last and rank p-1 hands its
// chunk 0's output to its own chunk 1. Micro-batch i's activations flow from virtual stage k to
// k+1, their gradients back from k+1 to k; between two ranks they travel as sends and receives,
// within a rank they are handed over in place.
//
//   rank 0:  F0 F1 F2 F3 B0 F4 B1 ...          (1F1B, p = 4: warm-up, then one forward, one backward)
//   rank 3:  F0 B0 F1 B1 F2 B2 ...
//
// Actions: F (forward of micro-batch i on chunk c), B (the gradient with respect to the chunk's
// input; with zero-bubble schedules the weight gradient W is a separate action), BW (a full
// backward: B and W together, for schedules that do not split it), and the four transfers: SendF /
// RecvF (activations to / from the next / previous virtual stage), SendB / RecvB (input gradients to
// the previous / from the next). A transfer names the micro-batch and the chunk of the rank that
// performs it; its peer follows from the virtual stages.
#include <string>
#include <vector>

namespace zero::parallel {

enum class Op { kF, kB, kW, kBW, kSendF, kRecvF, kSendB, kRecvB };

// "F", "B", "W", "BW", "SendF", "RecvF", "SendB", "RecvB".
const char* op_name(Op op);
bool is_compute(Op op);
bool is_transfer(Op op);
bool is_receive(Op op);  // RecvF or RecvB: where a stage waits for its peer

struct Action {
  Op op = Op::kF;
  int mb = 0;     // micro-batch
  int chunk = 0;  // the rank's model chunk
  bool operator==(const Action&) const = default;
};

// "F3", "B0c1", "SendF2c1" (the chunk shown when the schedule has more than one).
std::string describe(const Action& action, int chunks = 1);

// Where a rank's chunks lie in the model (the header).
enum class Placement { kLoop, kV };

struct Schedule {
  std::string name;
  Placement placement = Placement::kLoop;  // kV needs chunks == 2
  int ranks = 1;         // p: pipeline ranks
  int chunks = 1;        // v: model chunks per rank
  int microbatches = 1;  // m
  bool split_backward = false;  // B and W separate (else BW)
  std::vector<std::vector<Action>> actions;  // per rank

  int virtual_stages() const { return ranks * chunks; }
  int virtual_stage(int rank, int chunk) const {
    return placement == Placement::kV && chunk == 1 ? 2 * ranks - 1 - rank : chunk * ranks + rank;
  }
  int rank_of(int stage) const {
    return placement == Placement::kV && stage >= ranks ? 2 * ranks - 1 - stage : stage % ranks;
  }
  int chunk_of(int stage) const { return stage / ranks; }  // the same in a loop and in a V
  // The rank a transfer action of (rank, chunk) talks to: the next virtual stage's for SendF and
  // RecvB, the previous one's for RecvF and SendB.
  int peer(int rank, const Action& transfer) const;
  // Whether activations of (rank, chunk) go to / come from another rank (else in place or none).
  bool sends_forward(int rank, int chunk) const;
  bool receives_forward(int rank, int chunk) const;
};

}  // namespace zero::parallel
