#include "zero/param_registry.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "base/check.h"

namespace zero {

size_t shape_numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) ZERO_THROW(InvalidArgument, "shape {} has a non-positive dimension", shape_string(shape));
    if (n > std::numeric_limits<size_t>::max() / static_cast<size_t>(d)) {
      ZERO_THROW(InvalidArgument, "shape {} overflows the element count", shape_string(shape));
    }
    n *= static_cast<size_t>(d);
  }
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

void ParamRegistry::note_error(const std::string& message) {
  if (local_error_.empty()) local_error_ = message;
}

int ParamRegistry::add(const ParamSpec& spec) {
  const int id = static_cast<int>(params_.size());
  size_t n = 0;
  try {
    if (spec.name.empty()) ZERO_THROW(InvalidArgument, "parameter #{} has an empty name", id);
    if (find(spec.name)) ZERO_THROW(InvalidArgument, "parameter '{}' is registered twice", spec.name);
    if (spec.dtype != DType::kFloat32 && spec.dtype != DType::kFloat16 &&
        spec.dtype != DType::kBFloat16) {
      ZERO_THROW(InvalidArgument, "parameter '{}': dtype {} is not fp32, fp16 or bf16", spec.name,
                 dtype_name(spec.dtype));
    }
    try {
      n = shape_numel(spec.shape);
    } catch (const InvalidArgument& e) {
      ZERO_THROW(InvalidArgument, "parameter '{}': {}", spec.name, e.what());
    }
    if (spec.data.ptr == nullptr) {
      ZERO_THROW(InvalidArgument, "parameter '{}': data pointer is null", spec.name);
    }
    if (spec.data.numel != n) {
      ZERO_THROW(InvalidArgument, "parameter '{}': data holds {} elements but shape {} needs {}",
                 spec.name, spec.data.numel, shape_string(spec.shape), n);
    }
    if (spec.grad.ptr != nullptr && spec.grad.numel != n) {
      ZERO_THROW(InvalidArgument,
                 "parameter '{}': gradient pointer holds {} elements but shape {} needs {}",
                 spec.name, spec.grad.numel, shape_string(spec.shape), n);
    }
    if (spec.group < 0) ZERO_THROW(InvalidArgument, "parameter '{}': group {} < 0", spec.name, spec.group);
  } catch (const InvalidArgument& e) {
    note_error(e.what());
  }
  params_.push_back(spec);
  numels_.push_back(n);
  return id;
}

const ParamSpec& ParamRegistry::param(int id) const {
  if (id < 0 || static_cast<size_t>(id) >= params_.size()) {
    ZERO_THROW(InvalidArgument, "parameter id {} is not registered ({} parameters)", id, params_.size());
  }
  return params_[static_cast<size_t>(id)];
}

std::vector<int> ParamRegistry::trainable() const {
  std::vector<int> ids;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].requires_grad) ids.push_back(static_cast<int>(i));
  }
  return ids;
}

std::optional<int> ParamRegistry::find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return static_cast<int>(i);
  }
  return std::nullopt;
}

std::vector<std::string> ParamRegistry::signature_lines() const {
  std::vector<std::string> lines;
  for (const ParamSpec& p : params_) {
    lines.push_back(fmt::format("'{}' shape {} {}{} group {} unit {}", p.name, shape_string(p.shape),
                                dtype_name(p.dtype), p.requires_grad ? "" : " frozen", p.group,
                                p.unit));
  }
  return lines;
}

namespace {

// Exchanges one string per rank (all_gather of lengths, then of padded payloads as int32 words).
std::vector<std::string> all_gather_strings(comm::Communicator& comm, const std::string& mine,
                                            std::chrono::milliseconds timeout) {
  const int n = comm.size();
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  int64_t my_len = static_cast<int64_t>(mine.size());
  comm.all_gather(&my_len, lengths.data(), 1, DType::kInt64)->wait(timeout);
  const int64_t max_len = *std::max_element(lengths.begin(), lengths.end());
  const size_t words = static_cast<size_t>((max_len + 3) / 4);
  if (words == 0) return std::vector<std::string>(static_cast<size_t>(n));
  std::vector<int32_t> send(words, 0), recv(words * static_cast<size_t>(n), 0);
  std::memcpy(send.data(), mine.data(), mine.size());
  comm.all_gather(send.data(), recv.data(), words, DType::kInt32)->wait(timeout);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    const char* p = reinterpret_cast<const char*>(recv.data() + static_cast<size_t>(r) * words);
    out.emplace_back(p, static_cast<size_t>(lengths[static_cast<size_t>(r)]));
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    lines.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace

void ParamRegistry::verify_across_ranks(comm::Communicator& comm,
                                        std::chrono::milliseconds timeout) const {
  // A rank with a local error sends "!" + message instead of its signature.
  std::string mine;
  if (!local_error_.empty()) {
    mine = "!" + local_error_;
  } else {
    for (const std::string& line : signature_lines()) mine += line + "\n";
  }
  const std::vector<std::string> all = all_gather_strings(comm, mine, timeout);

  std::string errors;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty() && all[r][0] == '!') {
      errors += fmt::format("\n  rank {}: {}", r, all[r].substr(1));
    }
  }
  if (!errors.empty()) {
    ZERO_THROW(InvalidArgument, "parameter registration failed on some ranks:{}", errors);
  }
  const std::vector<std::string> ref = split_lines(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const std::vector<std::string> other = split_lines(all[r]);
    std::vector<int> differing;
    for (size_t q = 1; q < all.size(); ++q) {
      if (all[q] != all[0]) differing.push_back(static_cast<int>(q));
    }
    const size_t common = std::min(ref.size(), other.size());
    size_t i = 0;
    while (i < common && ref[i] == other[i]) ++i;
    std::string detail;
    if (i < common) {
      detail = fmt::format("parameter #{}: rank 0 registered {} but rank {} registered {}", i, ref[i],
                           r, other[i]);
    } else if (ref.size() > other.size()) {
      detail = fmt::format("rank 0 registered {} parameters, rank {} only {}; first missing: {}",
                           ref.size(), r, other.size(), ref[i]);
    } else {
      detail = fmt::format("rank {} registered {} parameters, rank 0 only {}; first extra: {}", r,
                           other.size(), ref.size(), other[i]);
    }
    ZERO_THROW(InvalidArgument,
               "parameter registration differs across ranks (ranks differing from rank 0: {}): {}",
               fmt::join(differing, ", "), detail);
  }
}

}  // namespace zero
