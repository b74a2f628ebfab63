#pragma once
// Adafactor's update over a rank's elements of the groups that run it (optim/adafactor.h), around the
// sums AdafactorStats reduces over the shard group. Part of the grouped optimizer
// (zero/grouped_shard_optimizer.cc), which hands it every step_range; host memory.
//
// State: each matrix's row and column statistics R and C, whole, on every rank of the shard group
// (O(n + m); each rank updates them from the same reduced sums, so they agree); each vector's V for
// this rank's elements; in groups with a first moment (adafactor.beta1 > 0) M for this rank's
// elements, fixed at construction (a group cannot take one up or drop it later). Checkpoints see
// them per element: "exp_avg_sq_row" and "exp_avg_sq_col" (an element reads its row's R and its
// column's C), "exp_avg_sq" (a vector's V) and "exp_avg_update" (M). A load writes each rank's own
// elements, so R and C are written where a rank holds their row or column: the first step after it
// (set_step_count marks it) merges them over the shard group (and over the tensor-parallel group of
// split tensors) by maximum (the statistics are positive; what no load wrote is zero).
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "memory/device.h"
#include "optim/optimizer.h"
#include "zero/adafactor_stats.h"
#include "zero/checkpoint/state_encoding.h"

namespace zero {

class AdafactorUpdate {
 public:
  // `segments`: this rank's segments of Adafactor tensors (optimizer-space ranges). Allocates R and
  // C of every Adafactor matrix in `stats` and V of this rank's vector elements through `device`
  // (category optimizer_state); on a meta device (planning) only allocates.
  AdafactorUpdate(memory::Device& device, const optim::OptimizerOptions& options,
                  std::vector<const optim::Segment*> segments, AdafactorStats* stats, bool meta);

  void begin_step(const optim::OptimizerOptions& options, int64_t step);
  // The update of [begin, end) (a bucket's owned range); collective over the shard group where the
  // bucket holds Adafactor tensors.
  void step(const optim::StepInput& in, size_t begin, size_t end);
  // A checkpoint was written into the state (Engine::load, through set_step_count): the next step
  // first merges R and C over the shard group.
  void loaded();

  static bool keeps(const std::string& state);
  // Checkpoint access by optimizer-space element (zeros where an element keeps no such state).
  void read_state(const std::string& name, size_t begin, size_t n, float* out);
  void write_state(const std::string& name, size_t begin, size_t n, const float* in);
  // How a checkpoint stores [begin, begin + n) of state `name` (one tensor's elements): a matrix's R
  // once per row of the part (block_constant, its rows' length, the piece's start within a row) and
  // its C once per period (periodic): O(rows + cols) bytes, not 8 per element; none otherwise (an
  // element not Adafactor's too).
  StateEncoding state_encoding(const std::string& name, size_t begin, size_t n) const;
  size_t state_bytes() const;
  size_t numel() const;  // this rank's Adafactor elements

 private:
  struct Run {
    size_t begin = 0, end = 0;
    const optim::Segment* segment = nullptr;
    const AdafactorStats::Slot* slot = nullptr;
    size_t v_at = 0;  // a vector's: where this run's V starts in v_
    size_t m_at = SIZE_MAX;  // where this run's first moment starts in m_ (SIZE_MAX: none)
    // A split tensor's part: where this run's elements lie in the whole tensor, in order (empty: the
    // registered tensor is the whole; its element index is the whole's).
    std::vector<SplitRun> whole;
  };
  struct Matrix {
    size_t r_at = 0, c_at = 0;  // where R and C start in rc_
  };
  float* rc() { return rc_.as<float>(); }
  // fn(k, e) for the run's elements from optimizer-space `lo` on, k in [0, n), e the element's index
  // in the whole tensor.
  template <typename Fn>
  static void for_each_whole(const Run& r, size_t lo, size_t n, Fn&& fn);
  // State `name`'s value for optimizer-space element x of run r (R of its row, C of its column, a
  // vector's V); nullptr where the element keeps no such state.
  float* state_at(const std::string& name, const Run& r, size_t x);
  float* v() { return v_.as<float>(); }
  float* m() { return m_.as<float>(); }
  double beta2(const optim::Hyper& h) const;                       // this step's
  double step_size(const optim::Hyper& h, double param_rms) const;  // alpha_t

  AdafactorStats* stats_;
  bool meta_;
  std::vector<Run> runs_;                 // by begin
  std::vector<Matrix> matrices_;          // the matrices of stats_->tensors(), in order
  std::vector<size_t> matrix_of_;         // stats tensor index -> matrices_ index (SIZE_MAX: a vector)
  memory::Buffer rc_, v_, m_;             // R and C of every matrix back to back; V of the vector runs; M
  size_t rc_numel_ = 0, v_numel_ = 0, m_numel_ = 0;
  std::vector<optim::Hyper> groups_;
  std::vector<bool> first_moment_;        // per group, as constructed
  int64_t step_ = 0;
  bool merge_pending_ = false, written_ = false;
  std::vector<double> stats_buf_, update_buf_;
  std::vector<float> grad_, u_;
};

}  // namespace zero
