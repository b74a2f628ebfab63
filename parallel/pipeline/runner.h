#pragma once
// The pipeline runner: one rank's part of a checked schedule (schedule.h) executed with the user's
// stage functions over the pipeline group (comm::Mesh::pp(): pipeline rank r is its rank r).
//
// Activations and their gradients are typed buffers (stage_tensor.h) on the runner's device, which
// the runner allocates, sized by the caller's TensorSpec, before each stage function fills one; it
// moves them: to the next rank with a send, or in place to the rank's own next chunk. Activations travel on the
// pipeline group, gradients on a communicator split from it (one per kind: send/recv match in order
// per pair of ranks, and the checker pairs them per direction and kind). Receives are posted ahead
// (two per channel, the next one as soon as one is taken), so a transfer overlaps the compute before
// the action that needs it; sends are posted and waited for at the end of the step (their buffers
// live until then). Every compute action's start and end are recorded (seconds since the step
// began), for timeline_svg.h and the simulator's comparison.
//
// A stage function that throws, or a transfer that fails, ends the step with an error naming the
// rank, the action and the micro-batch ("pipeline rank 1: F of micro-batch 3 (chunk 0) failed: ...").
// Transfers carry a label naming what they hold ("act mb 3 from vs 1"), so that the communicator's
// schedule check names a disagreement in those terms.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "memory/device.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_sim.h"
#include "parallel/pipeline/stage_tensor.h"

namespace zero::parallel {

struct StageFunctions {
  // Forward of (mb, chunk): `input` is the previous virtual stage's activation (empty on the first
  // virtual stage); fills `output`, allocated to the activation's spec (empty on the last).
  std::function<void(int mb, int chunk, const StageTensor& input, StageTensor& output)> forward;
  // Input gradient of (mb, chunk), and with `with_weight` its weight gradient too (a BW): from
  // `grad_output` (empty on the last virtual stage, which starts from its loss); fills `grad_input`,
  // allocated to the input activation's spec (empty on the first virtual stage).
  std::function<void(int mb, int chunk, bool with_weight, const StageTensor& grad_output, StageTensor& grad_input)>
      backward;
  // The weight gradient of (mb, chunk) after its B (schedules that split the backward; required there).
  std::function<void(int mb, int chunk)> weight;
};

// Throws InvalidArgument naming the missing function: forward and backward always, weight where
// `schedule` splits the backward.
void check_functions(const StageFunctions& fns, const Schedule& schedule);

class PipelineRunner {
 public:
  // `schedule` must pass check_schedule (checked here). `activation(mb, k)`: the activation leaving
  // virtual stage k (and its gradient), which a receive must know ahead. Tensors live on `device`
  // (a host device of the runner's own when null; it must outlive the runner). Collective over `pp`
  // (it splits the gradients' communicator from it).
  PipelineRunner(Schedule schedule, int rank, comm::Communicator& pp,
                 std::function<TensorSpec(int mb, int virtual_stage)> activation, memory::Device* device = nullptr);

  // One step: every action of this rank, in order (check_functions first). Returns the compute
  // actions' spans (seconds since the step began on this rank).
  std::vector<Span> run(const StageFunctions& fns);
  // Where the tensors live.
  memory::Device& device() { return *device_; }
  // When the last run() began (steady clock: comparable across the processes of one machine).
  std::chrono::steady_clock::time_point last_start() const { return last_start_; }

 private:
  const Schedule schedule_;
  const int rank_;
  comm::Communicator& pp_;                    // activations
  std::unique_ptr<comm::Communicator> grads_;  // their gradients
  const std::function<TensorSpec(int, int)> spec_;
  std::unique_ptr<memory::MemoryTracker> own_tracker_;
  std::unique_ptr<memory::Device> own_device_;
  memory::Device* device_ = nullptr;
  std::chrono::steady_clock::time_point last_start_{};
};

}  // namespace zero::parallel
