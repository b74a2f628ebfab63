#include "comm/p2p_stall_check.h"

#include <algorithm>
#include <map>
#include <utility>

namespace zero::comm {

P2PStallCheck::P2PStallCheck(int rank, int size, std::chrono::milliseconds delay, Exchange exchange)
    : rank_(rank), delay_(delay), exchange_(std::move(exchange)),
      published_(static_cast<size_t>(std::max(size, 0))) {}

std::optional<P2PStallCheck::Verdict> P2PStallCheck::look(const std::vector<Pending>& pending,
                                                          Clock::time_point now) {
  // Per peer: every pending call with it (in a canonical order, so that an unchanged set is not
  // published again), and the stalled ones.
  std::map<int, std::vector<size_t>> all, stalled;
  oldest_ = std::chrono::milliseconds(0);
  for (size_t i = 0; i < pending.size(); ++i) {
    const int peer = pending[i].call.root;
    all[peer].push_back(i);
    const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - pending[i].posted);
    if (age >= delay_) {
      stalled[peer].push_back(i);
      oldest_ = std::max(oldest_, age);
    }
  }
  for (const auto& [peer, mine] : stalled) {
    if (peer < 0 || static_cast<size_t>(peer) >= published_.size()) continue;
    std::vector<size_t> calls = all[peer];
    std::sort(calls.begin(), calls.end(), [&](size_t a, size_t b) {
      const CallInfo& x = pending[a].call;
      const CallInfo& y = pending[b].call;
      return std::pair(x.kind, x.seq) < std::pair(y.kind, y.seq);
    });
    Bytes records;
    for (const size_t i : calls) {
      const CallRecord r = encode_call(pending[i].call);
      records.insert(records.end(), r.begin(), r.end());
    }
    Bytes& published = published_[static_cast<size_t>(peer)];
    if (records != published) {
      if (exchange_.publish) exchange_.publish(peer, records);
      published = std::move(records);
    }
    const Bytes theirs = exchange_.peer_calls ? exchange_.peer_calls(peer) : Bytes();
    for (const size_t i : mine) {
      std::string mismatch = compare(pending[i].call, theirs);
      if (!mismatch.empty()) return Verdict{i, std::move(mismatch)};
    }
  }
  return std::nullopt;
}

std::chrono::milliseconds P2PStallCheck::next_look() const {
  return std::clamp<std::chrono::milliseconds>(oldest_ / 4, kFirstLook, kLastLook);
}

std::string P2PStallCheck::compare_with_peer(const CallInfo& call) const {
  return compare(call, exchange_.peer_calls ? exchange_.peer_calls(call.root) : Bytes());
}

std::string P2PStallCheck::compare(const CallInfo& call, const Bytes& theirs) const {
  const bool sending = call.kind == CollectiveKind::kSend;
  const int peer = call.root;
  const CallRecord mine = encode_call(call);
  for (size_t off = 0; off + kCallRecordBytes <= theirs.size(); off += kCallRecordBytes) {
    CallRecord r;
    std::copy_n(theirs.begin() + static_cast<std::ptrdiff_t>(off), kCallRecordBytes, r.begin());
    CallInfo c;
    try {
      c = decode_call(r);
    } catch (const std::exception&) {
      return {};  // a torn or foreign value: no verdict rather than a wrong one
    }
    const bool partner =
        c.seq == call.seq && c.kind == (sending ? CollectiveKind::kRecv : CollectiveKind::kSend);
    if (!partner) continue;
    return sending ? find_p2p_mismatch(mine, rank_, r, peer) : find_p2p_mismatch(r, peer, mine, rank_);
  }
  return {};
}

P2PStallCheck::Exchange store_exchange(std::shared_ptr<Store> store, std::string prefix, int rank) {
  auto key = [prefix = std::move(prefix)](int from, int to) {
    return prefix + "/p2p_pending/" + std::to_string(from) + "/" + std::to_string(to);
  };
  P2PStallCheck::Exchange e;
  e.publish = [store, key, rank](int peer, const Bytes& records) {
    try {
      store->set(key(rank, peer), records);
    } catch (const std::exception&) {
    }
  };
  e.peer_calls = [store, key, rank](int peer) {
    try {
      if (!store->check({key(peer, rank)})) return Bytes();
      return store->get(key(peer, rank), std::chrono::seconds(1));
    } catch (const std::exception&) {
      return Bytes();
    }
  };
  return e;
}

}  // namespace zero::comm
