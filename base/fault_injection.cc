#include "base/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "base/check.h"

namespace zero::fault {
namespace {

constexpr std::array<const char*, 10> kPoints = {"forward",        "reduce_scatter",   "prefetch",
                                                 "optimizer_step", "checkpoint_write", "collective_sends",
                                                 "tp_collective",  "pipeline_action",  "shard_at_rest",
                                                 "gathered"};
// The points that hold bytes a "flip" can change.
constexpr std::array<const char*, 2> kBytePoints = {"shard_at_rest", "gathered"};

std::atomic<bool> g_armed{false};
std::mutex g_mu;
Plan g_plan;
int g_arrivals = 0;

void fire(const Plan& p, void* data, size_t bytes) {
  // Straight to stderr, unbuffered and without the logger: the launcher shows it with the rank's
  // prefix, and a killed process flushes nothing later.
  std::fprintf(stderr, "fault injection: %s at '%s'\n",
               p.action == Plan::Action::kKill    ? "killing this process"
               : p.action == Plan::Action::kKillParent ? "killing this process's parent (its launcher: the node lost whole)"
               : p.action == Plan::Action::kStall ? "stalling this thread for good"
               : p.action == Plan::Action::kStop  ? "stopping this process (SIGSTOP)"
               : p.action == Plan::Action::kFlip  ? "flipping one bit"
               : p.action == Plan::Action::kThrow ? "throwing"
                                                  : "delaying this thread",
               p.point.c_str());
  std::fflush(stderr);
  switch (p.action) {
    case Plan::Action::kKill:
      ::kill(::getpid(), SIGKILL);
      break;
    case Plan::Action::kKillParent:
      // The launcher's ranks follow it (they die with their parent), this one included.
      ::kill(::getppid(), SIGKILL);
      ::kill(::getpid(), SIGKILL);
      break;
    case Plan::Action::kStop:
      ::kill(::getpid(), SIGSTOP);
      break;
    case Plan::Action::kFlip:
      // The lowest bit of the second byte: a mantissa bit of the first float (or of a bf16's exponent's
      // neighbour): any flip changes what a checksum sees.
      if (bytes > 1) static_cast<unsigned char*>(data)[1] ^= 1u;
      break;
    case Plan::Action::kStall:
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    case Plan::Action::kDelay:
      std::this_thread::sleep_for(std::chrono::duration<double>(p.delay_s));
      break;
    case Plan::Action::kThrow:
      ZERO_THROW(Error, "fault injected at '{}'", p.point);
  }
}

}  // namespace

Plan parse_plan(std::string_view text) {
  const std::string t(text);
  const size_t a = t.find(':');
  if (a == std::string::npos) ZERO_THROW(InvalidArgument, "fault plan '{}': expected POINT:ACTION[:N]", t);
  Plan p;
  p.point = t.substr(0, a);
  bool known = false;
  for (const char* k : kPoints) known = known || p.point == k;
  if (!known) {
    ZERO_THROW(InvalidArgument, "fault plan '{}': unknown point '{}' (forward, reduce_scatter, prefetch, optimizer_step, "
                                "checkpoint_write, collective_sends, tp_collective, pipeline_action, shard_at_rest, gathered)", t,
               p.point);
  }
  const size_t b = t.find(':', a + 1);
  const std::string action = t.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
  if (action == "kill") {
    p.action = Plan::Action::kKill;
  } else if (action == "kill_parent") {
    p.action = Plan::Action::kKillParent;
  } else if (action == "stall") {
    p.action = Plan::Action::kStall;
  } else if (action == "stop") {
    p.action = Plan::Action::kStop;
  } else if (action == "throw") {
    p.action = Plan::Action::kThrow;
  } else if (action == "flip") {
    bool holds_bytes = false;
    for (const char* k : kBytePoints) holds_bytes = holds_bytes || p.point == k;
    if (!holds_bytes) {
      ZERO_THROW(InvalidArgument, "fault plan '{}': flip changes the bytes a point holds; only shard_at_rest and "
                                  "gathered hold any", t);
    }
    p.action = Plan::Action::kFlip;
  } else if (action.rfind("delay=", 0) == 0) {
    p.action = Plan::Action::kDelay;
    char* end = nullptr;
    p.delay_s = std::strtod(action.c_str() + 6, &end);
    if (end == action.c_str() + 6 || *end != '\0' || p.delay_s < 0) {
      ZERO_THROW(InvalidArgument, "fault plan '{}': delay '{}' is not a number of seconds", t, action.substr(6));
    }
  } else {
    ZERO_THROW(InvalidArgument, "fault plan '{}': unknown action '{}' (kill, kill_parent, stop, stall, delay=S, throw, flip)", t, action);
  }
  if (b != std::string::npos) {
    char* end = nullptr;
    const long n = std::strtol(t.c_str() + b + 1, &end, 10);
    if (*end != '\0' || n < 1) ZERO_THROW(InvalidArgument, "fault plan '{}': N must be a positive integer", t);
    p.nth = static_cast<int>(n);
  }
  return p;
}

void arm(const Plan& plan) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_plan = plan;
  g_arrivals = 0;
  g_armed.store(true, std::memory_order_release);
}

void disarm() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_armed.store(false, std::memory_order_release);
}

void point(const char* name) { point(name, nullptr, 0); }

void point(const char* name, void* data, size_t bytes) {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  Plan p;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_armed.load(std::memory_order_relaxed) || g_plan.point != name || ++g_arrivals != g_plan.nth) return;
    g_armed.store(false, std::memory_order_relaxed);  // once
    p = g_plan;
  }
  fire(p, data, bytes);
}

}  // namespace zero::fault
