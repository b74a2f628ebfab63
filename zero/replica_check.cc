#include "zero/replica_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "base/check.h"
#include "zero/checkpoint/crc32c.h"
#include "zero/rank_agreement.h"

namespace zero {

std::vector<uint32_t> replica_checksums(memory::Device& device, const std::vector<ReplicaPiece>& pieces,
                                        std::chrono::milliseconds timeout) {
  memory::Stream& compute = device.compute_stream();
  device.synchronize(compute, timeout);  // the step's writes of the copies
  std::vector<uint32_t> out;
  out.reserve(pieces.size());
  const bool host = device.kind() != memory::DeviceKind::kCuda;
  for (const ReplicaPiece& p : pieces) {
    if (host || p.bytes == 0) {
      out.push_back(crc32c(p.data, p.bytes));
      continue;
    }
    memory::Buffer staged = device.allocate_host_staging(p.bytes, memory::Category::kOther);
    device.copy(staged.data(), p.data, p.bytes, compute);
    device.synchronize(compute, timeout);
    out.push_back(crc32c(staged.data(), p.bytes));
  }
  return out;
}

namespace {

// "ranks 0, 1, 3" / "rank 2".
std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

ReplicaVerdict compare_replicas(comm::Communicator& comm, memory::Device& device, const std::vector<ReplicaPiece>& pieces,
                                const std::vector<uint32_t>& checksums, int rank_name, int64_t step,
                                const std::string& group, std::chrono::milliseconds timeout) {
  ZERO_CHECK(checksums.size() == pieces.size(), "compare_replicas: {} checksums for {} pieces", checksums.size(),
             pieces.size());
  if (comm.size() <= 1) return {};
  bool named = false;
  const auto names_me = [&](const std::vector<int>& ranks) {
    named = named || std::find(ranks.begin(), ranks.end(), rank_name) != ranks.end();
  };
  std::vector<AgreementEntry> entries{{"rank", std::to_string(rank_name)}};
  for (uint32_t c : checksums) entries.push_back({"", fmt::format("{:08x}", c)});
  const std::vector<std::vector<AgreementEntry>> all = all_gather_entries(comm, &device, entries, timeout);
  std::vector<std::string> found;
  for (size_t k = 0; k < pieces.size(); ++k) {
    // The ranks holding each checksum; the largest set is the majority (a tie: none is).
    std::map<std::string, std::vector<int>> holders;
    for (const auto& r : all) {
      ZERO_CHECK(r.size() == pieces.size() + 1, "replica check: a rank sent {} checksums, this one {}", r.size() - 1,
                 pieces.size());
      holders[r[k + 1].value].push_back(std::stoi(r[0].value));
    }
    if (holders.size() == 1) continue;
    auto most = std::max_element(holders.begin(), holders.end(),
                                 [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    const bool tie = std::count_if(holders.begin(), holders.end(), [&](const auto& h) {
                       return h.second.size() == most->second.size();
                     }) > 1;
    if (tie) {
      std::vector<std::pair<std::vector<int>, std::string>> by_rank;
      for (const auto& [crc, ranks] : holders) {
        by_rank.emplace_back(ranks, crc);
        names_me(ranks);
      }
      std::sort(by_rank.begin(), by_rank.end());
      std::vector<std::string> each;
      for (const auto& [ranks, crc] : by_rank) each.push_back(fmt::format("{} CRC32C {}", ranks_text(ranks), crc));
      found.push_back(fmt::format("{} differs with no majority: {}", pieces[k].name, fmt::join(each, ", ")));
      continue;
    }
    for (const auto& [crc, ranks] : holders) {
      if (crc == most->first) continue;
      names_me(ranks);
      found.push_back(fmt::format("{} on {} differs from {} (CRC32C {} against {})", pieces[k].name, ranks_text(ranks),
                                  ranks_text(most->second), crc, most->first));
    }
  }
  if (found.empty()) return {};
  const size_t listed = std::min<size_t>(found.size(), 8);
  return {.text = fmt::format("replicas disagree after step {} in the {}: {}{}", step, group,
                              fmt::join(found.begin(), found.begin() + static_cast<std::ptrdiff_t>(listed), "; "),
                              found.size() > listed ? fmt::format("; and {} more", found.size() - listed) : ""),
          .this_rank = named};
}

std::string agree_on_verdict(comm::Communicator& comm, memory::Device& device, const std::string& verdict,
                             std::chrono::milliseconds timeout) {
  if (comm.size() <= 1) return verdict;
  // The agreement's encoding takes no newlines; verdicts have none.
  const auto all = all_gather_entries(comm, &device, {{"verdict", verdict}}, timeout);
  if (!verdict.empty()) return verdict;
  for (const auto& r : all) {
    if (!r.empty() && !r[0].value.empty()) return r[0].value;
  }
  return {};
}

}  // namespace zero
