#include "zero/checkpoint/node_copies.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/error.h"
#include "zero/checkpoint/checkpoint_manifest.h"
#include "zero/checkpoint/checkpoint_parts.h"
#include "zero/checkpoint/crc32c.h"
#include "zero/checkpoint/file_io.h"
#include "zero/rank_agreement.h"

namespace zero {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using checkpoint_internal::attempt;

// A file travels in pieces of this size, so that neither side holds a whole data file in memory.
constexpr size_t kPieceBytes = size_t{64} << 20;

// The nodes in the order their first ranks come.
std::vector<int> node_order(const std::vector<int>& node_of_rank) {
  std::vector<int> order;
  for (int n : node_of_rank) {
    if (std::find(order.begin(), order.end(), n) == order.end()) order.push_back(n);
  }
  return order;
}

std::vector<int> ranks_on(const std::vector<int>& node_of_rank, int node) {
  std::vector<int> ranks;
  for (size_t r = 0; r < node_of_rank.size(); ++r) {
    if (node_of_rank[r] == node) ranks.push_back(static_cast<int>(r));
  }
  return ranks;
}

// `bytes` of file `path` to rank `peer` / from rank `peer` into `path` (written under a temporary
// name, then renamed), piece by piece.
void send_file(comm::Communicator& comm, const std::string& path, uint64_t bytes, int peer,
               std::chrono::milliseconds timeout) {
  const FileReader in(path);
  if (in.size() != bytes) ZERO_THROW(IoError, "'{}' holds {} bytes, its index says {}", path, in.size(), bytes);
  std::vector<uint8_t> piece(static_cast<size_t>(std::min<uint64_t>(bytes, kPieceBytes)));
  for (uint64_t at = 0; at < bytes; at += kPieceBytes) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPieceBytes, bytes - at));
    in.read(piece.data(), n, at);
    comm.send(piece.data(), n, DType::kUInt8, peer)->wait(timeout);
  }
}

void receive_file(comm::Communicator& comm, const std::string& path, uint64_t bytes, int peer,
                  std::chrono::milliseconds timeout) {
  FileWriter out(path);
  std::vector<uint8_t> piece(static_cast<size_t>(std::min<uint64_t>(bytes, kPieceBytes)));
  for (uint64_t at = 0; at < bytes; at += kPieceBytes) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPieceBytes, bytes - at));
    comm.recv(piece.data(), n, DType::kUInt8, peer)->wait(timeout);
    out.write(piece.data(), n);
  }
  out.commit();
}

// Every rank's error ("" for none) becomes the same IoError on every rank, naming the ranks (the
// agreement every checkpoint operation makes, on the copies' own communicator).
void agree_on(comm::Communicator& comm, const std::string& what, const std::string& error,
              std::chrono::milliseconds timeout) {
  try {
    check_agreement(comm, {what, "has"}, {}, error, timeout);
  } catch (const InvalidArgument& e) {
    throw IoError(e.what());
  }
}

// ---- the restore ----------------------------------------------------------------------------------

// A save one directory of a node holds: which directory ("" or ".old"), its step, the manifest's
// checksum (which tells two saves of the same step apart), and which ranks' data files are there
// whole (of the size the manifest gives).
struct Held {
  std::string tail;
  int64_t step = 0;
  uint32_t manifest_crc = 0;
  std::vector<uint64_t> bytes;  // each rank's data file size, from the manifest
  std::vector<bool> present;
};

std::optional<Held> look_at(const std::string& dir, const std::string& tail, std::vector<std::string>& notes) {
  const std::string where = dir + tail;
  if (!path_exists(where + "/manifest.json")) return std::nullopt;
  try {
    const std::string text = read_whole_file(where + "/manifest.json");
    const json m = json::parse(text);
    if (m.contains("parts")) ZERO_THROW(InvalidArgument, "a model-parallel checkpoint (node copies hold one engine's)");
    Held h{.tail = tail, .step = m.at("step").get<int64_t>(), .manifest_crc = crc32c(text.data(), text.size())};
    for (const json& f : m.at("files")) {
      const int rank = f.at("rank").get<int>();
      if (rank != static_cast<int>(h.bytes.size())) ZERO_THROW(InvalidArgument, "its files are not listed by rank");
      h.bytes.push_back(f.at("bytes").get<uint64_t>());
      const std::string index = where + "/" + f.at("index").get<std::string>();
      const std::string data = where + "/" + f.at("file").get<std::string>();
      std::error_code ec;
      const auto size = fs::file_size(data, ec);
      h.present.push_back(!ec && size == h.bytes.back() && path_exists(index));
    }
    return h;
  } catch (const std::exception& e) {
    notes.push_back(fmt::format("'{}': {}", where, e.what()));
    return std::nullopt;
  }
}

std::string encode(const std::vector<Held>& held) {
  std::string s;
  for (const Held& h : held) {
    s += fmt::format("{} {} {} ", h.tail.empty() ? "-" : h.tail, h.step, h.manifest_crc);
    for (size_t r = 0; r < h.present.size(); ++r) {
      s += fmt::format("{}{}{}", r ? "," : "", h.present[r] ? "" : "~", h.bytes[r]);  // ~: not here
    }
    s += "\n";
  }
  return s;
}

std::vector<Held> decode(const std::string& s) {
  std::vector<Held> out;
  std::istringstream lines(s);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    Held h;
    std::string files;
    in >> h.tail >> h.step >> h.manifest_crc >> files;
    if (h.tail == "-") h.tail.clear();
    std::istringstream each(files);
    std::string v;
    while (std::getline(each, v, ',')) {
      h.present.push_back(v[0] != '~');
      h.bytes.push_back(std::stoull(v[0] == '~' ? v.substr(1) : v));
    }
    out.push_back(std::move(h));
  }
  return out;
}

// One file a node lacks, from the first rank of a node that has it to the first rank of this one.
struct Transfer {
  std::string file;
  uint64_t bytes = 0;
  int from = 0, to = 0;  // ranks
  std::string from_tail, to_tail;
};

}  // namespace

std::vector<int> gather_nodes(comm::Communicator& comm, int node, std::chrono::milliseconds timeout) {
  std::vector<int> out;
  for (const std::string& s : all_gather_strings(comm, nullptr, std::to_string(node), timeout)) out.push_back(std::stoi(s));
  return out;
}

int node_leader(const std::vector<int>& node_of_rank, int rank) {
  return ranks_on(node_of_rank, node_of_rank.at(static_cast<size_t>(rank))).front();
}

int buddy_of(const std::vector<int>& node_of_rank, int rank) {
  const std::vector<int> order = node_order(node_of_rank);
  if (order.size() < 2) return -1;
  const int node = node_of_rank.at(static_cast<size_t>(rank));
  const std::vector<int> mine = ranks_on(node_of_rank, node);
  const size_t place = static_cast<size_t>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  const size_t k = static_cast<size_t>(std::find(order.begin(), order.end(), node) - order.begin());
  const std::vector<int> next = ranks_on(node_of_rank, order[(k + 1) % order.size()]);
  return next[place % next.size()];
}

void exchange_node_copies(const NodeCopies& copies, const std::string& partial, const std::string& local_error,
                          std::chrono::milliseconds timeout) {
  comm::Communicator& comm = *copies.comm;
  const int rank = comm.rank();
  const std::vector<int>& nodes = copies.node_of_rank;
  // Every index to every node (small); a rank that could not write its files sends "!" and why, and
  // then every rank stops here with the same error.
  std::string mine = "!" + local_error;
  if (local_error.empty()) {
    const std::string read = attempt([&] { mine = read_whole_file(partial + "/" + checkpoint_rank_file(rank, "json")); });
    if (!read.empty()) mine = "!" + read;
  }
  const std::vector<std::string> indexes = all_gather_strings(comm, nullptr, mine, timeout);
  std::string failed;
  for (size_t r = 0; r < indexes.size(); ++r) {
    if (!indexes[r].empty() && indexes[r][0] == '!') failed += fmt::format("\n  rank {}: {}", r, indexes[r].substr(1));
  }
  if (!failed.empty()) ZERO_THROW(IoError, "checkpoint '{}' failed on some ranks:{}", partial, failed);
  std::string error = attempt([&] {
    // The node's first rank writes the other nodes' indexes.
    std::vector<uint64_t> bytes;
    for (const std::string& text : indexes) bytes.push_back(json::parse(text).at("bytes").get<uint64_t>());
    if (node_leader(nodes, rank) == rank) {
      for (size_t r = 0; r < indexes.size(); ++r) {
        if (nodes[r] == nodes[static_cast<size_t>(rank)]) continue;
        FileWriter f(partial + "/" + checkpoint_rank_file(static_cast<int>(r), "json"));
        f.write(indexes[r].data(), indexes[r].size());
        f.commit();
      }
    }
    // Each data file to its buddy, one pair after another in rank order: every rank takes its part
    // in the same order, so no two ranks wait on each other.
    for (int s = 0; s < comm.size(); ++s) {
      const int buddy = buddy_of(nodes, s);
      if (buddy < 0) break;
      const std::string file = partial + "/" + checkpoint_rank_file(s, "bin");
      if (rank == s) send_file(comm, file, bytes[static_cast<size_t>(s)], buddy, timeout);
      if (rank == buddy) receive_file(comm, file, bytes[static_cast<size_t>(s)], s, timeout);
    }
  });
  agree_on(comm, fmt::format("checkpoint '{}': the copies on other nodes", partial), error, timeout);
}

std::optional<FoundCheckpoint> restore_node_copies(comm::Communicator& comm, const std::vector<int>& node_of_rank,
                                                   const std::string& dir, std::chrono::milliseconds timeout,
                                                   std::vector<std::string>* passed_over) {
  const int rank = comm.rank();
  std::vector<std::string> notes;
  std::vector<Held> here;
  for (const char* tail : {"", ".old"}) {
    if (std::optional<Held> h = look_at(dir, tail, notes)) here.push_back(std::move(*h));
  }
  const std::vector<std::string> all = all_gather_strings(comm, nullptr, encode(here), timeout);
  // What each node holds (its first rank speaks for it), by save (step, manifest checksum).
  const std::vector<int> order = node_order(node_of_rank);
  std::map<std::pair<int64_t, uint32_t>, std::map<int, Held>> saves;  // save -> node -> what it holds
  for (int node : order) {
    const int leader = ranks_on(node_of_rank, node).front();
    for (Held& h : decode(all[static_cast<size_t>(leader)])) {
      saves[{h.step, h.manifest_crc}].emplace(node, std::move(h));
    }
  }
  // The newest save whose every data file some node holds.
  const std::map<int, Held>* chosen = nullptr;
  int64_t step = 0;
  for (auto it = saves.rbegin(); it != saves.rend(); ++it) {
    const size_t files = it->second.begin()->second.present.size();
    std::vector<int> missing;
    for (size_t r = 0; r < files; ++r) {
      bool held = false;
      for (const auto& [node, h] : it->second) held = held || (h.present.size() == files && h.present[r]);
      if (!held) missing.push_back(static_cast<int>(r));
    }
    if (missing.empty()) {
      chosen = &it->second;
      step = it->first.first;
      break;
    }
    notes.push_back(fmt::format("the save of step {} in '{}': no node holds rank {}'s data file (lost with its node "
                                "and its buddy's)",
                                it->first.first, dir, fmt::join(missing, ", rank ")));
  }
  if (passed_over != nullptr) passed_over->insert(passed_over->end(), notes.begin(), notes.end());
  if (chosen == nullptr) return std::nullopt;

  // What each node lacks, from the first node (in order) that has it.
  const Held& any = chosen->begin()->second;
  const size_t files = any.present.size();
  std::vector<Transfer> transfers;
  for (int node : order) {
    const int to = ranks_on(node_of_rank, node).front();
    const auto own = chosen->find(node);
    const std::string to_tail = own != chosen->end() ? own->second.tail : ".partial";
    auto source = [&](size_t r) {
      for (int n : order) {
        const auto h = chosen->find(n);
        if (h != chosen->end() && h->second.present[r]) return std::make_pair(ranks_on(node_of_rank, n).front(), h->second.tail);
      }
      ZERO_THROW(CheckError, "no node holds rank {}'s data file", r);
    };
    if (own == chosen->end()) {
      // The node lost the save whole: its manifest and indexes first.
      const auto [from, from_tail] = source(0);
      transfers.push_back({"manifest.json", 0, from, to, from_tail, to_tail});
      for (size_t r = 0; r < files; ++r) {
        transfers.push_back({checkpoint_rank_file(static_cast<int>(r), "json"), 0, from, to, from_tail, to_tail});
      }
    }
    for (size_t r = 0; r < files; ++r) {
      if (own != chosen->end() && own->second.present[r]) continue;
      const auto [from, from_tail] = source(r);
      transfers.push_back({checkpoint_rank_file(static_cast<int>(r), "bin"), any.bytes[r], from, to, from_tail, to_tail});
    }
  }
  const bool leader = node_leader(node_of_rank, rank) == rank;
  const auto mine = chosen->find(node_of_rank[static_cast<size_t>(rank)]);
  const std::string tail = mine != chosen->end() ? mine->second.tail : "";
  std::string error = attempt([&] {
    if (leader && mine == chosen->end()) {
      fs::remove_all(dir + ".partial");
      fs::create_directories(dir + ".partial");
    }
    for (const Transfer& t : transfers) {
      if (rank != t.from && rank != t.to) continue;
      uint64_t bytes = t.bytes;
      if (bytes == 0) {
        // A manifest or an index: its size first, from the side that has it.
        int64_t n = rank == t.from ? static_cast<int64_t>(fs::file_size(dir + t.from_tail + "/" + t.file)) : 0;
        if (rank == t.from) comm.send(&n, 1, DType::kInt64, t.to)->wait(timeout);
        if (rank == t.to) comm.recv(&n, 1, DType::kInt64, t.from)->wait(timeout);
        bytes = static_cast<uint64_t>(n);
      }
      if (rank == t.from) send_file(comm, dir + t.from_tail + "/" + t.file, bytes, t.to, timeout);
      if (rank == t.to) receive_file(comm, dir + t.to_tail + "/" + t.file, bytes, t.from, timeout);
    }
    // The manifest came first and is in: the directory is whole, and takes DIR's place.
    if (leader && mine == chosen->end()) swap_in_directory(dir + ".partial", dir);
  });
  agree_on(comm, fmt::format("restoring the checkpoint of step {} from the nodes' copies", step), error, timeout);
  return FoundCheckpoint{.dir = dir + tail, .step = step};
}

}  // namespace zero
