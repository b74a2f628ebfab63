#include "parallel/pipeline/runner.h"

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "base/check.h"
#include "base/fault_injection.h"
#include "parallel/pipeline/pipeline_check.h"

namespace zero::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using Key = std::pair<int, int>;  // (micro-batch, chunk)
constexpr size_t kReceivesAhead = 2;

// What a transfer holds, the same words on both ranks: "act mb 3 from vs 1", "grad mb 3 from vs 2".
std::string label_of(bool grads, int mb, int from_stage) {
  return fmt::format("{} mb {} from vs {}", grads ? "grad" : "act", mb, from_stage);
}

// One step's state on this rank: the buffers in flight and the receives posted ahead.
class Step {
 public:
  Step(const Schedule& s, int rank, comm::Communicator& acts, comm::Communicator& grads,
       const std::function<TensorSpec(int, int)>& spec, memory::Device& device)
      : s_(s), rank_(rank), acts_(acts), grads_(grads), spec_(spec), device_(device) {
    // Each channel's receives in the order this rank takes them: (peer, gradients?) -> keys.
    for (const Action& a : s.actions[static_cast<size_t>(rank)]) {
      if (is_receive(a.op)) {
        channels_[{s.peer(rank, a), a.op == Op::kRecvB}].todo.push_back({a.mb, a.chunk});
      }
    }
    for (auto& [channel, c] : channels_) {
      for (size_t i = 0; i < kReceivesAhead; ++i) post_next(channel, c);
    }
  }

  ~Step() {
    // Transfers still posted when the step ends early (an error): giving up on them at once fails
    // the communicator (connections closed, so the other ranks fail now, not at their timeout, and
    // nothing writes into these buffers after the wait returns).
    for (auto& [channel, c] : channels_) {
      for (Posted& p : c.posted) give_up(p.work);
    }
    for (Sent& x : sent_) give_up(x.work);
  }

  void run(const Action& a, const StageFunctions& fns, std::vector<Span>& spans, Clock::time_point t0) {
    const int k = s_.virtual_stage(rank_, a.chunk);
    const Key key{a.mb, a.chunk};
    auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    switch (a.op) {
      case Op::kRecvF: input_[key] = take({s_.peer(rank_, a), false}, key); return;
      case Op::kRecvB: grad_out_[key] = take({s_.peer(rank_, a), true}, key); return;
      case Op::kSendF: send(a, false, std::move(output_.at(key)), k); output_.erase(key); return;
      case Op::kSendB: send(a, true, std::move(grad_in_.at(key)), k); grad_in_.erase(key); return;
      default: break;
    }
    fault::point("pipeline_action");
    const double start = seconds();
    if (a.op == Op::kF) {
      StageTensor out = k + 1 < s_.virtual_stages() ? allocate(a.mb, k) : StageTensor();
      fns.forward(a.mb, a.chunk, input_[key], out);
      input_.erase(key);
      if (k + 1 < s_.virtual_stages() && s_.rank_of(k + 1) == rank_) {
        input_[{a.mb, s_.chunk_of(k + 1)}] = std::move(out);  // this rank's next chunk
      } else {
        output_[key] = std::move(out);
      }
    } else if (a.op == Op::kB || a.op == Op::kBW) {
      StageTensor grad_in = k > 0 ? allocate(a.mb, k - 1) : StageTensor();
      fns.backward(a.mb, a.chunk, a.op == Op::kBW, grad_out_[key], grad_in);
      grad_out_.erase(key);
      if (k > 0 && s_.rank_of(k - 1) == rank_) {
        grad_out_[{a.mb, s_.chunk_of(k - 1)}] = std::move(grad_in);
      } else if (k > 0) {
        grad_in_[key] = std::move(grad_in);
      }
    } else {
      fns.weight(a.mb, a.chunk);
    }
    spans.push_back({a, start, seconds()});
  }

  void finish() {
    for (Sent& x : sent_) x.work->wait();
    sent_.clear();
  }

 private:
  struct Posted {
    Key key;
    StageTensor buf;
    comm::WorkHandle work;
  };
  struct Channel {
    std::deque<Key> todo;      // not posted yet
    std::deque<Posted> posted;  // posted, in order
  };
  struct Sent {
    StageTensor buf;
    comm::WorkHandle work;
  };

  void post_next(const std::pair<int, bool>& channel, Channel& c) {
    if (c.todo.empty()) return;
    const auto [peer, grads] = channel;
    const Key key = c.todo.front();
    c.todo.pop_front();
    const int k = s_.virtual_stage(rank_, key.second);
    const int from = grads ? k + 1 : k - 1;  // the sending virtual stage
    Posted p{key, allocate(key.first, grads ? k : from), nullptr};
    comm::Communicator& comm = grads ? grads_ : acts_;
    comm::CallLabel label(comm, label_of(grads, key.first, from));
    p.work = comm.recv(p.buf.data(), p.buf.numel(), p.buf.dtype(), peer);
    c.posted.push_back(std::move(p));
  }

  StageTensor take(const std::pair<int, bool>& channel, const Key& key) {
    Channel& c = channels_.at(channel);
    ZERO_CHECK(!c.posted.empty() && c.posted.front().key == key, "receive of micro-batch {} chunk {} not posted first",
               key.first, key.second);
    Posted p = std::move(c.posted.front());
    c.posted.pop_front();
    p.work->wait();
    post_next(channel, c);
    return std::move(p.buf);
  }

  void send(const Action& a, bool grads, StageTensor buf, int k) {
    comm::Communicator& comm = grads ? grads_ : acts_;
    comm::CallLabel label(comm, label_of(grads, a.mb, k));
    Sent x{std::move(buf), nullptr};
    x.work = comm.send(x.buf.data(), x.buf.numel(), x.buf.dtype(), s_.peer(rank_, a));
    sent_.push_back(std::move(x));
  }

  static void give_up(const comm::WorkHandle& w) {
    try {
      if (w) w->wait(std::chrono::milliseconds(1));
    } catch (...) {
    }
  }

  const Schedule& s_;
  const int rank_;
  comm::Communicator& acts_;
  comm::Communicator& grads_;
  // The tensor of micro-batch `mb` leaving virtual stage `k` (or its gradient), as the spec says.
  StageTensor allocate(int mb, int k) { return StageTensor::allocate(device_, spec_(mb, k)); }

  const std::function<TensorSpec(int, int)>& spec_;
  memory::Device& device_;
  std::map<std::pair<int, bool>, Channel> channels_;
  std::map<Key, StageTensor> input_, output_, grad_out_, grad_in_;
  std::deque<Sent> sent_;
};

}  // namespace

void check_functions(const StageFunctions& fns, const Schedule& schedule) {
  if (!fns.forward) ZERO_THROW(InvalidArgument, "pipeline stage functions: no forward (StageFunctions::forward)");
  if (!fns.backward) ZERO_THROW(InvalidArgument, "pipeline stage functions: no backward (StageFunctions::backward)");
  if (schedule.split_backward && !fns.weight) {
    ZERO_THROW(InvalidArgument,
               "pipeline stage functions: the schedule '{}' splits the backward into B and W but no weight "
               "function was given (StageFunctions::weight)",
               schedule.name);
  }
}

PipelineRunner::PipelineRunner(Schedule schedule, int rank, comm::Communicator& pp,
                               std::function<TensorSpec(int mb, int virtual_stage)> activation,
                               memory::Device* device)
    : schedule_(std::move(schedule)), rank_(rank), pp_(pp), spec_(std::move(activation)), device_(device) {
  if (device_ == nullptr) {
    own_tracker_ = std::make_unique<memory::MemoryTracker>();
    own_device_ = memory::make_host_device(*own_tracker_);
    device_ = own_device_.get();
  }
  check_schedule(schedule_);
  if (pp.size() != schedule_.ranks || rank < 0 || rank >= schedule_.ranks || pp.rank() != rank) {
    ZERO_THROW(InvalidArgument, "pipeline runner: rank {} of a {}-rank schedule on a pipeline group of {} (its rank {})",
               rank, schedule_.ranks, pp.size(), pp.rank());
  }
  grads_ = pp.split(0, rank);
}

std::vector<Span> PipelineRunner::run(const StageFunctions& fns) {
  check_functions(fns, schedule_);
  const auto t0 = Clock::now();
  last_start_ = t0;
  std::vector<Span> spans;
  Step step(schedule_, rank_, pp_, *grads_, spec_, *device_);
  for (const Action& a : schedule_.actions[static_cast<size_t>(rank_)]) {
    try {
      step.run(a, fns, spans, t0);
    } catch (const std::exception& e) {
      ZERO_THROW(Error, "pipeline rank {}: {} of {} failed: {}", rank_, op_name(a.op),
                 schedule_.chunks > 1 ? fmt::format("micro-batch {} (chunk {})", a.mb, a.chunk)
                                      : fmt::format("micro-batch {}", a.mb),
                 e.what());
    }
  }
  step.finish();
  return spans;
}

}  // namespace zero::parallel
