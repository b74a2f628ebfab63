#include "zero/rank_agreement.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace zero {
namespace {

// all_gather of host arrays: directly on a host communicator, through device buffers otherwise.
void gather_host(comm::Communicator& comm, memory::Device* device, const void* send, void* recv, size_t count,
                 DType dtype, std::chrono::milliseconds timeout) {
  if (comm.accepts(memory::DeviceKind::kHost)) {
    comm.all_gather(send, recv, count, dtype)->wait(timeout);
    return;
  }
  ZERO_CHECK(device != nullptr, "communicator '{}' takes no host memory and no device was given", comm.backend_name());
  const size_t bytes = count * dtype_size(dtype), all = bytes * static_cast<size_t>(comm.size());
  memory::Buffer d_send = device->allocate(bytes, memory::Category::kOther);
  memory::Buffer d_recv = device->allocate(all, memory::Category::kOther);
  memory::Stream& s = device->compute_stream();
  device->copy(d_send.data(), send, bytes, s);
  comm.set_issue_stream(device->native_handle(s));
  comm.all_gather(d_send.data(), d_recv.data(), count, dtype)->wait_stream(device->native_handle(s));
  device->copy(recv, d_recv.data(), all, s);
  device->synchronize(s, timeout);
}


// Entries travel as "key\tvalue\n" lines; keys and values never hold tabs or newlines.
std::string encode(const std::vector<AgreementEntry>& entries) {
  std::string s;
  for (const AgreementEntry& e : entries) s += e.key + '\t' + e.value + '\n';
  return s;
}

std::vector<AgreementEntry> decode(const std::string& s) {
  std::vector<AgreementEntry> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    const std::string line = s.substr(start, end - start);
    const size_t tab = line.find('\t');
    out.push_back({line.substr(0, tab), tab == std::string::npos ? "" : line.substr(tab + 1)});
    start = end + 1;
  }
  return out;
}

std::string first_difference(const AgreementSubject& subject, const std::vector<AgreementEntry>& ref,
                             const std::vector<AgreementEntry>& other, size_t r) {
  const size_t common = std::min(ref.size(), other.size());
  size_t i = 0;
  while (i < common && ref[i].key == other[i].key && ref[i].value == other[i].value) ++i;
  if (i < common) {
    if (ref[i].key != other[i].key) {
      return fmt::format("entry #{}: rank 0 {} {} but rank {} {} {}", i, subject.verb, ref[i].key, r,
                         subject.verb, other[i].key);
    }
    return fmt::format("{}: rank 0 {} {} but rank {} {} {}", ref[i].key, subject.verb, ref[i].value, r,
                       subject.verb, other[i].value);
  }
  if (ref.size() > other.size()) {
    return fmt::format("rank 0 has {} entries, rank {} only {}; first missing: {} {}", ref.size(), r,
                       other.size(), ref[i].key, ref[i].value);
  }
  return fmt::format("rank {} has {} entries, rank 0 only {}; first extra: {} {}", r, other.size(),
                     ref.size(), other[i].key, other[i].value);
}

}  // namespace

// An all_gather of the lengths, then of the payloads padded to int32 words.
std::vector<std::string> all_gather_strings(comm::Communicator& comm, memory::Device* device,
                                            const std::string& mine, std::chrono::milliseconds timeout) {
  const int n = comm.size();
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  int64_t my_len = static_cast<int64_t>(mine.size());
  gather_host(comm, device, &my_len, lengths.data(), 1, DType::kInt64, timeout);
  const int64_t max_len = *std::max_element(lengths.begin(), lengths.end());
  const size_t words = static_cast<size_t>((max_len + 3) / 4);
  if (words == 0) return std::vector<std::string>(static_cast<size_t>(n));
  std::vector<int32_t> send(words, 0), recv(words * static_cast<size_t>(n), 0);
  std::memcpy(send.data(), mine.data(), mine.size());
  gather_host(comm, device, send.data(), recv.data(), words, DType::kInt32, timeout);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    const char* p = reinterpret_cast<const char*>(recv.data() + static_cast<size_t>(r) * words);
    out.emplace_back(p, static_cast<size_t>(lengths[static_cast<size_t>(r)]));
  }
  return out;
}

std::vector<std::vector<AgreementEntry>> all_gather_entries(comm::Communicator& comm, memory::Device* device,
                                                          const std::vector<AgreementEntry>& entries,
                                                          std::chrono::milliseconds timeout) {
  std::vector<std::vector<AgreementEntry>> out;
  for (const std::string& s : all_gather_strings(comm, device, encode(entries), timeout)) out.push_back(decode(s));
  return out;
}


void check_agreement(comm::Communicator& comm, const AgreementSubject& subject,
                     const std::vector<AgreementEntry>& entries, const std::string& local_error,
                     std::chrono::milliseconds timeout, memory::Device* device) {
  // A rank with a local error sends "!" + message instead of its entries.
  const std::string mine = local_error.empty() ? encode(entries) : "!" + local_error;
  const std::vector<std::string> all = all_gather_strings(comm, device, mine, timeout);

  std::string errors;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty() && all[r][0] == '!') errors += fmt::format("\n  rank {}: {}", r, all[r].substr(1));
  }
  if (!errors.empty()) ZERO_THROW(InvalidArgument, "{} failed on some ranks:{}", subject.what, errors);

  std::vector<int> differing;
  for (size_t q = 1; q < all.size(); ++q) {
    if (all[q] != all[0]) differing.push_back(static_cast<int>(q));
  }
  if (differing.empty()) return;
  const size_t r = static_cast<size_t>(differing.front());
  ZERO_THROW(InvalidArgument, "{} differs across ranks (ranks differing from rank 0: {}): {}", subject.what,
             fmt::join(differing, ", "), first_difference(subject, decode(all[0]), decode(all[r]), r));
}

}  // namespace zero
