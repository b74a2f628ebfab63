#pragma once
// Fault injection for the reliability tests (tests/fault_test.cc): named points in the engine and
// communication code where this process can be made to fail in a chosen way, so that a test can
// show what every other rank and the launcher do when a rank dies, stalls or runs late at exactly
// that point. Off unless a program arms it (the example programs' --fault flag); the library reads
// no environment for it, and an unarmed point costs one relaxed atomic load.
//
//   POINT:ACTION[:N]        e.g. "reduce_scatter:kill", "prefetch:stall:3", "optimizer_step:delay=8"
//
// ACTION: kill (SIGKILL: the process vanishes mid-step, as an OOM kill or a node loss), kill_parent
// (SIGKILL to the parent, then to this process: under a launcher whose ranks die with it, zerorun's,
// the node is lost whole), stop (SIGSTOP:
// the whole process freezes, its heartbeat too, as a hung node), stall (the thread sleeps and never
// returns: the process stays alive and silent, its sockets open), flip (one bit of the bytes the point
// holds changes: memory corrupted at rest; only points that hold bytes take it), delay=S
// (sleeps S seconds, then goes on: a rank late past its peers' timeout), throw (an Error from the
// point: a failing stage function). N: fire the N-th time the point is reached (default 1); it
// fires once.
//
// The points: "forward" (a unit's forward scope opens), "reduce_scatter" (a gradient bucket's
// reduction is about to be issued), "prefetch" (stage 3 issues a prefetch all-gather),
// "optimizer_step" (the sharded update begins), "checkpoint_write" (a rank's checkpoint data file is
// written but not yet synced, renamed or indexed: once per save), "collective_sends" (inside a Gloo reduce-scatter, after its receives are posted and
// before any data is sent: a rank that stalls mid-collective), "tp_collective" (a tensor-parallel
// region's collective, f or g or their sequence-parallel forms, is about to be issued),
// "pipeline_action" (the pipeline runner is about to run a compute action: F, B, W or BW),
// "shard_at_rest" (stage 3's parameter shard between two steps, with its bytes: what flip changes),
// "gathered" (a unit's parameters as stage 3 gathered them for a training forward, with their
// bytes: a flip there stands for data corrupted in flight).
#include <cstddef>
#include <string>
#include <string_view>

namespace zero::fault {

struct Plan {
  enum class Action { kKill, kKillParent, kStop, kStall, kDelay, kThrow, kFlip };
  std::string point;
  Action action = Action::kKill;
  double delay_s = 0;
  int nth = 1;
};

// InvalidArgument naming the text and what is wrong (an unknown point or action included).
Plan parse_plan(std::string_view text);
// Arms `plan` for this process (replacing an armed one); thread-safe.
void arm(const Plan& plan);
void disarm();

// A named point: does nothing unless the armed plan names it and this is its N-th arrival.
void point(const char* name);
// A point that holds `bytes` bytes at `data`, which a flip plan changes.
void point(const char* name, void* data, size_t bytes);

}  // namespace zero::fault
