#include "parallel/pipeline/pipeline_check.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/check.h"

namespace zero::parallel {
namespace {

[[noreturn]] void refuse(const Schedule& s, int rank, const std::string& what) {
  ZERO_THROW(InvalidArgument, "pipeline schedule '{}': rank {}: {}", s.name, rank, what);
}

std::string batch(const Schedule& s, int mb, int chunk) {
  return s.chunks > 1 ? fmt::format("micro-batch {} (chunk {})", mb, chunk) : fmt::format("micro-batch {}", mb);
}

using Key = std::tuple<Op, int, int>;  // op, micro-batch, chunk

// Where each action of one rank is, and how often it occurs.
struct RankIndex {
  std::map<Key, size_t> first;
  std::map<Key, int> count;
  bool has(Op op, int mb, int chunk) const { return first.count({op, mb, chunk}) > 0; }
  size_t at(Op op, int mb, int chunk) const { return first.at({op, mb, chunk}); }
};

RankIndex index_rank(const Schedule& s, int rank) {
  RankIndex ix;
  const auto& actions = s.actions[static_cast<size_t>(rank)];
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.mb < 0 || a.mb >= s.microbatches || a.chunk < 0 || a.chunk >= s.chunks) {
      refuse(s, rank, fmt::format("action #{} ({}) names micro-batch {} chunk {}, outside {} micro-batches x {} chunks", i,
                                  describe(a, s.chunks), a.mb, a.chunk, s.microbatches, s.chunks));
    }
    const bool split_op = a.op == Op::kB || a.op == Op::kW;
    if (split_op != s.split_backward && (split_op || a.op == Op::kBW)) {
      refuse(s, rank, fmt::format("action #{} ({}): the schedule {} its backward", i, describe(a, s.chunks),
                                  s.split_backward ? "splits (B and W, not BW)" : "does not split (BW, not B and W)"));
    }
    const Key k{a.op, a.mb, a.chunk};
    ix.first.emplace(k, i);
    ++ix.count[k];
  }
  return ix;
}

// Exactly one of each compute action, and exactly the transfers the virtual stage needs.
void check_counts(const Schedule& s, int rank, const RankIndex& ix) {
  for (int c = 0; c < s.chunks; ++c) {
    const int k = s.virtual_stage(rank, c);
    const bool in = s.receives_forward(rank, c), out = s.sends_forward(rank, c);
    std::vector<std::pair<Op, int>> want = {{Op::kF, 1}, {Op::kRecvF, in}, {Op::kSendF, out}, {Op::kRecvB, out},
                                            {Op::kSendB, in}};
    if (s.split_backward) {
      want.push_back({Op::kB, 1});
      want.push_back({Op::kW, 1});
    } else {
      want.push_back({Op::kBW, 1});
    }
    for (int mb = 0; mb < s.microbatches; ++mb) {
      for (const auto& [op, n] : want) {
        const auto it = ix.count.find({op, mb, c});
        const int got = it == ix.count.end() ? 0 : it->second;
        if (got == n) continue;
        std::string why;
        if (op == Op::kRecvF || op == Op::kSendB) {
          why = in ? fmt::format(" (virtual stage {} is on rank {})", k - 1, s.rank_of(k - 1))
                   : " (its input is not another rank's)";
        } else if (op == Op::kSendF || op == Op::kRecvB) {
          why = out ? fmt::format(" (virtual stage {} is on rank {})", k + 1, s.rank_of(k + 1))
                    : " (its output goes to no other rank)";
        }
        refuse(s, rank, fmt::format("{} has {} {} where it needs {}{}", batch(s, mb, c), got, op_name(op), n, why));
      }
    }
  }
}

// Every action after what it uses on this rank.
void check_order(const Schedule& s, int rank, const RankIndex& ix) {
  const Op backward = s.split_backward ? Op::kB : Op::kBW;
  for (int c = 0; c < s.chunks; ++c) {
    const int k = s.virtual_stage(rank, c);
    for (int mb = 0; mb < s.microbatches; ++mb) {
      auto before = [&](Op op, Op dep, int dep_chunk) {
        if (ix.at(dep, mb, dep_chunk) > ix.at(op, mb, c)) {
          refuse(s, rank, fmt::format("{} of {} comes before its {}{}", op_name(op), batch(s, mb, c), op_name(dep),
                                      dep_chunk == c ? "" : fmt::format(" of chunk {}", dep_chunk)));
        }
      };
      if (s.receives_forward(rank, c)) {
        before(Op::kF, Op::kRecvF, c);
        before(Op::kSendB, backward, c);
      } else if (k > 0) {
        before(Op::kF, Op::kF, s.chunk_of(k - 1));  // the previous virtual stage is this rank's
      }
      if (s.sends_forward(rank, c)) {
        before(Op::kSendF, Op::kF, c);
        before(backward, Op::kRecvB, c);
      } else if (k + 1 < s.virtual_stages()) {
        before(backward, backward, s.chunk_of(k + 1));
      }
      before(backward, Op::kF, c);
      if (s.split_backward) before(Op::kW, Op::kB, c);
    }
  }
}

// A transfer's channel (from, to, gradients?) and identity (micro-batch, sending virtual stage).
struct Transfer {
  std::tuple<int, int, bool> channel;
  std::pair<int, int> id;
  bool send;
};

Transfer transfer_of(const Schedule& s, int rank, const Action& a) {
  const int k = s.virtual_stage(rank, a.chunk), peer = s.peer(rank, a);
  switch (a.op) {
    case Op::kSendF: return {{rank, peer, false}, {a.mb, k}, true};
    case Op::kRecvF: return {{peer, rank, false}, {a.mb, k - 1}, false};
    case Op::kSendB: return {{rank, peer, true}, {a.mb, k}, true};
    default: return {{peer, rank, true}, {a.mb, k + 1}, false};  // kRecvB
  }
}

// The k-th send of a channel must be the k-th receive's data.
void check_pairing(const Schedule& s) {
  std::map<std::tuple<int, int, bool>, std::vector<std::pair<int, int>>> sends, recvs;
  for (int r = 0; r < s.ranks; ++r) {
    for (const Action& a : s.actions[static_cast<size_t>(r)]) {
      if (!is_transfer(a.op)) continue;
      const Transfer t = transfer_of(s, r, a);
      (t.send ? sends : recvs)[t.channel].push_back(t.id);
    }
  }
  for (const auto& [channel, out] : sends) {
    const auto& [from, to, grads] = channel;
    const std::vector<std::pair<int, int>>& in = recvs[channel];
    for (size_t i = 0; i < out.size() && i < in.size(); ++i) {
      if (out[i] == in[i]) continue;
      auto name = [&](const std::pair<int, int>& id) { return batch(s, id.first, s.chunk_of(id.second)); };
      refuse(s, from,
             fmt::format("sends {} to rank {} in another order than rank {} receives them (the k-th send meets the "
                         "k-th receive): its send #{} is {} of virtual stage {}, rank {}'s receive #{} is {} of virtual "
                         "stage {}",
                         grads ? "gradients" : "activations", to, to, i, name(out[i]), out[i].second, to, i,
                         name(in[i]), in[i].second));
    }
  }
}

// Runs the order: sends are posted and go on, a receive waits for its send. Refuses a schedule
// where ranks wait forever, naming where each waits.
void check_deadlock(const Schedule& s) {
  std::map<std::tuple<int, int, bool>, size_t> sent, received;
  std::vector<size_t> pc(static_cast<size_t>(s.ranks), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.ranks; ++r) {
      const auto& actions = s.actions[static_cast<size_t>(r)];
      size_t& i = pc[static_cast<size_t>(r)];
      for (; i < actions.size(); ++i, progress = true) {
        const Action& a = actions[i];
        if (!is_transfer(a.op)) continue;
        const Transfer t = transfer_of(s, r, a);
        if (t.send) {
          ++sent[t.channel];
        } else if (received[t.channel] < sent[t.channel]) {
          ++received[t.channel];
        } else {
          break;  // waits for the send
        }
      }
    }
  }
  std::vector<std::string> waiting;
  for (int r = 0; r < s.ranks; ++r) {
    const size_t i = pc[static_cast<size_t>(r)];
    const auto& actions = s.actions[static_cast<size_t>(r)];
    if (i == actions.size()) continue;
    waiting.push_back(fmt::format("rank {} waits at {} of {} (from rank {})", r, op_name(actions[i].op),
                                  batch(s, actions[i].mb, actions[i].chunk), s.peer(r, actions[i])));
  }
  if (!waiting.empty()) {
    ZERO_THROW(InvalidArgument, "pipeline schedule '{}' deadlocks: {}", s.name, fmt::format("{}", fmt::join(waiting, "; ")));
  }
}

}  // namespace

void check_schedule(const Schedule& s) {
  if (s.ranks < 1 || s.chunks < 1 || s.microbatches < 1) {
    ZERO_THROW(InvalidArgument, "pipeline schedule '{}': {} ranks, {} chunks, {} micro-batches (each must be positive)",
               s.name, s.ranks, s.chunks, s.microbatches);
  }
  if (s.placement == Placement::kV && s.chunks != 2) {
    ZERO_THROW(InvalidArgument, "pipeline schedule '{}': a V placement holds 2 chunks per rank, not {}", s.name,
               s.chunks);
  }
  if (s.actions.size() != static_cast<size_t>(s.ranks)) {
    ZERO_THROW(InvalidArgument, "pipeline schedule '{}': action lists for {} ranks, not {}", s.name, s.actions.size(),
               s.ranks);
  }
  for (int r = 0; r < s.ranks; ++r) {
    const RankIndex ix = index_rank(s, r);
    check_counts(s, r, ix);
    check_order(s, r, ix);
  }
  check_pairing(s);
  check_deadlock(s);
}

}  // namespace zero::parallel
