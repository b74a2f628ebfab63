#include "comm/launch/dist_env.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <charconv>
#include <optional>

#include "base/check.h"
#include "base/env.h"
#include "base/logging.h"
#include "comm/store/memory_store.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"

namespace zero::comm {

namespace {

constexpr int kSlurmDefaultPortBase = 29500;

// Parses a decimal integer in [lo, hi]; errors name the variable and its value.
int64_t parse_int(const char* name, const std::string& value, int64_t lo, int64_t hi) {
  int64_t out = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (value.empty() || ec != std::errc() || ptr != end) {
    ZERO_THROW(InvalidArgument, "{}='{}' is not an integer", name, value);
  }
  if (out < lo || out > hi) {
    ZERO_THROW(InvalidArgument, "{}={} is out of range [{}, {}]", name, out, lo, hi);
  }
  return out;
}

std::optional<int64_t> env_int_opt(const char* name, int64_t lo, int64_t hi) {
  const auto v = env_get(name);
  if (!v) return std::nullopt;
  return parse_int(name, *v, lo, hi);
}

int64_t env_int_required(const char* name, int64_t lo, int64_t hi, const char* source) {
  const auto v = env_get(name);
  if (!v) ZERO_THROW(InvalidArgument, "{} launch detected but {} is not set", source, name);
  return parse_int(name, *v, lo, hi);
}

// A non-negative decimal number of seconds; errors name the variable and its value.
double parse_seconds(const char* name, const std::string& value) {
  double out = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (value.empty() || ec != std::errc() || ptr != end || !(out >= 0)) {
    ZERO_THROW(InvalidArgument, "{}='{}' is not a number of seconds", name, value);
  }
  return out;
}

constexpr int64_t kMaxWorld = 1 << 24;

// MASTER_ADDR / MASTER_PORT, required when more than one process takes part.
void read_master(DistEnv& env, const char* source) {
  const auto addr = env_get("MASTER_ADDR");
  const auto port = env_get("MASTER_PORT");
  if (env.world_size > 1) {
    if (!addr || addr->empty()) {
      ZERO_THROW(InvalidArgument, "{} launch with world size {}: MASTER_ADDR is not set", source,
                 env.world_size);
    }
    if (!port) {
      ZERO_THROW(InvalidArgument, "{} launch with world size {}: MASTER_PORT is not set", source,
                 env.world_size);
    }
  }
  if (addr && !addr->empty()) env.master_addr = *addr;
  if (port) env.master_port = static_cast<uint16_t>(parse_int("MASTER_PORT", *port, env.world_size > 1 ? 1 : 0, 65535));
}

void check_ranks(const DistEnv& env, const char* rank_var, const char* size_var,
                 const char* local_rank_var, const char* local_size_var) {
  if (env.rank >= env.world_size) {
    ZERO_THROW(InvalidArgument, "{}={} is out of range for {}={}", rank_var, env.rank, size_var,
               env.world_size);
  }
  if (env.local_world_size > env.world_size) {
    ZERO_THROW(InvalidArgument, "{}={} is larger than {}={}", local_size_var, env.local_world_size,
               size_var, env.world_size);
  }
  if (env.local_rank >= env.local_world_size) {
    ZERO_THROW(InvalidArgument, "{}={} is out of range for {}={}", local_rank_var, env.local_rank,
               local_size_var, env.local_world_size);
  }
}

DistEnv read_torchrun() {
  DistEnv env;
  env.source = "torchrun";
  env.world_size = static_cast<int>(env_int_required("WORLD_SIZE", 1, kMaxWorld, "torchrun-style"));
  env.rank = static_cast<int>(env_int_required("RANK", 0, kMaxWorld, "torchrun-style"));
  const auto local_rank = env_int_opt("LOCAL_RANK", 0, kMaxWorld);
  const auto local_size = env_int_opt("LOCAL_WORLD_SIZE", 1, kMaxWorld);
  // Without the local variables, assume one node.
  env.local_rank = static_cast<int>(local_rank.value_or(env.rank));
  env.local_world_size = static_cast<int>(local_size.value_or(env.world_size));
  check_ranks(env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  const char* node_var = env_get("ZERO_NODE_RANK") ? "ZERO_NODE_RANK" : "GROUP_RANK";
  env.node = static_cast<int>(env_int_opt(node_var, 0, kMaxWorld).value_or(env.rank / env.local_world_size));
  read_master(env, "torchrun-style");
  return env;
}

DistEnv read_openmpi() {
  DistEnv env;
  env.source = "openmpi";
  env.world_size = static_cast<int>(env_int_required("OMPI_COMM_WORLD_SIZE", 1, kMaxWorld, "Open MPI"));
  env.rank = static_cast<int>(env_int_required("OMPI_COMM_WORLD_RANK", 0, kMaxWorld, "Open MPI"));
  env.local_rank = static_cast<int>(env_int_opt("OMPI_COMM_WORLD_LOCAL_RANK", 0, kMaxWorld).value_or(env.rank));
  env.local_world_size = static_cast<int>(
      env_int_opt("OMPI_COMM_WORLD_LOCAL_SIZE", 1, kMaxWorld).value_or(env.world_size));
  check_ranks(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE");
  env.node = env.rank / env.local_world_size;
  read_master(env, "Open MPI");
  return env;
}

DistEnv read_slurm() {
  DistEnv env;
  env.source = "slurm";
  const char* ntasks_var = env_get("SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
  env.world_size = static_cast<int>(env_int_required(ntasks_var, 1, kMaxWorld, "Slurm"));
  env.rank = static_cast<int>(env_int_required("SLURM_PROCID", 0, kMaxWorld, "Slurm"));
  env.local_rank = static_cast<int>(env_int_required("SLURM_LOCALID", 0, kMaxWorld, "Slurm"));
  const int node_id = static_cast<int>(env_int_opt("SLURM_NODEID", 0, kMaxWorld).value_or(0));
  const char* local_size_var = "SLURM_NTASKS_PER_NODE";
  if (const auto v = env_get("SLURM_NTASKS_PER_NODE")) {
    env.local_world_size = slurm_tasks_on_node(*v, node_id);
  } else if (const auto t = env_get("SLURM_TASKS_PER_NODE")) {
    local_size_var = "SLURM_TASKS_PER_NODE";
    env.local_world_size = slurm_tasks_on_node(*t, node_id);
  } else {
    const char* nodes_var = env_get("SLURM_NNODES") ? "SLURM_NNODES" : "SLURM_JOB_NUM_NODES";
    const auto nodes = env_int_opt(nodes_var, 1, kMaxWorld);
    if (!nodes) {
      ZERO_THROW(InvalidArgument,
                 "Slurm launch: cannot tell the tasks per node (none of SLURM_NTASKS_PER_NODE, "
                 "SLURM_TASKS_PER_NODE, SLURM_NNODES is set)");
    }
    if (env.world_size % *nodes != 0) {
      ZERO_THROW(InvalidArgument,
                 "Slurm launch: {}={} tasks do not divide evenly over {}={} nodes; set "
                 "SLURM_NTASKS_PER_NODE",
                 ntasks_var, env.world_size, nodes_var, *nodes);
    }
    local_size_var = nodes_var;
    env.local_world_size = static_cast<int>(env.world_size / *nodes);
  }
  check_ranks(env, "SLURM_PROCID", ntasks_var, "SLURM_LOCALID", local_size_var);
  env.node = node_id;

  if (const auto addr = env_get("MASTER_ADDR"); addr && !addr->empty()) {
    env.master_addr = *addr;
  } else {
    const char* list_var = env_get("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
    const auto list = env_get(list_var);
    if (!list) {
      ZERO_THROW(InvalidArgument, "Slurm launch: neither MASTER_ADDR nor SLURM_JOB_NODELIST is set");
    }
    try {
      env.master_addr = slurm_first_host(*list);
    } catch (const InvalidArgument& e) {
      ZERO_THROW(InvalidArgument, "{}='{}': {}", list_var, *list, e.what());
    }
  }
  if (const auto port = env_get("MASTER_PORT")) {
    env.master_port = static_cast<uint16_t>(parse_int("MASTER_PORT", *port, 1, 65535));
  } else {
    const auto job = env_int_opt("SLURM_JOB_ID", 0, INT64_MAX).value_or(0);
    env.master_port = static_cast<uint16_t>(kSlurmDefaultPortBase + job % 1000);
  }
  return env;
}

bool resolves_to_loopback(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0) return false;
  bool loopback = false;
  if (list->ai_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(list->ai_addr);
    loopback = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  } else if (list->ai_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(list->ai_addr);
    loopback = IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
  }
  ::freeaddrinfo(list);
  return loopback;
}

}  // namespace

std::string slurm_first_host(const std::string& nodelist) {
  // The first entry ends at the first comma outside brackets.
  std::string out;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    const char c = nodelist[i];
    if (c == ']') ZERO_THROW(InvalidArgument, "unbalanced ']' in node list '{}'", nodelist);
    if (c != '[') {
      out += c;
      ++i;
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) ZERO_THROW(InvalidArgument, "unbalanced '[' in node list '{}'", nodelist);
    // "[03-05,07]": the first range's start, keeping its zero padding.
    const std::string inside = nodelist.substr(i + 1, close - i - 1);
    const size_t stop = inside.find_first_of(",-");
    const std::string first = inside.substr(0, stop);
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) {
      ZERO_THROW(InvalidArgument, "bad range '[{}]' in node list '{}'", inside, nodelist);
    }
    out += first;
    i = close + 1;
  }
  // Surrounding spaces are never part of a host name.
  const auto b = out.find_first_not_of(' ');
  const auto e = out.find_last_not_of(' ');
  out = b == std::string::npos ? std::string() : out.substr(b, e - b + 1);
  if (out.empty()) ZERO_THROW(InvalidArgument, "empty node list '{}'", nodelist);
  return out;
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id) {
  // Entries "N" or "N(xR)" (N tasks on each of R nodes), comma separated.
  int node = 0;
  size_t i = 0;
  const std::string& s = tasks_per_node;
  while (i < s.size()) {
    const size_t end = std::min(s.find(',', i), s.size());
    const std::string entry = s.substr(i, end - i);
    const size_t paren = entry.find("(x");
    const std::string count_text = entry.substr(0, paren);
    int64_t count = 0, repeat = 1;
    try {
      count = parse_int("tasks per node", count_text, 1, kMaxWorld);
      if (paren != std::string::npos) {
        if (entry.back() != ')') throw InvalidArgument("missing ')'");
        repeat = parse_int("repeat", entry.substr(paren + 2, entry.size() - paren - 3), 1, kMaxWorld);
      }
    } catch (const InvalidArgument&) {
      ZERO_THROW(InvalidArgument, "bad tasks-per-node entry '{}' in '{}'", entry, s);
    }
    if (node_id < node + repeat) return static_cast<int>(count);
    node += static_cast<int>(repeat);
    i = end + 1;
  }
  ZERO_THROW(InvalidArgument, "tasks-per-node list '{}' has no entry for node {} (SLURM_NODEID)", s,
             node_id);
}

DistEnv read_dist_env() {
  DistEnv env;
  if (env_get("RANK") || env_get("WORLD_SIZE")) {
    env = read_torchrun();
  } else if (env_get("OMPI_COMM_WORLD_RANK") || env_get("OMPI_COMM_WORLD_SIZE")) {
    env = read_openmpi();
  } else if (env_get("SLURM_PROCID")) {
    env = read_slurm();
  } else {
    env.source = "default";
  }
  env.token = env_string("ZERO_JOB_TOKEN", "");
  if (const auto v = env_get("ZERO_STORE_IN_LAUNCHER")) {
    if (*v != "0" && *v != "1") ZERO_THROW(InvalidArgument, "ZERO_STORE_IN_LAUNCHER='{}' must be 0 or 1", *v);
    env.store_in_launcher = *v == "1";
  }
  env.store_prefix = env_string("ZERO_STORE_PREFIX", "");
  env.restart_count = static_cast<int>(env_int_opt("ZERO_RESTART_COUNT", 0, INT32_MAX).value_or(0));
  env.first_world_size = static_cast<int>(env_int_opt("ZERO_FIRST_WORLD_SIZE", 1, kMaxWorld).value_or(env.world_size));
  if (const auto at = env_get("ZERO_RESTART_FAILED_AT")) env.restart_failed_at = parse_seconds("ZERO_RESTART_FAILED_AT", *at);
  env.restart_reason = env_string("ZERO_RESTART_REASON", "");
  if (const auto fd = env_int_opt("ZERO_HEARTBEAT_FD", 0, INT32_MAX)) {
    env.heartbeat_fd = static_cast<int>(*fd);
    env.heartbeat_interval_ms = static_cast<int>(env_int_required("ZERO_HEARTBEAT_INTERVAL_MS", 1, 3600 * 1000, "ZERO_HEARTBEAT_FD"));
  }
  return env;
}

std::shared_ptr<Store> connect_store(const DistEnv& env, std::chrono::milliseconds timeout) {
  if (env.world_size < 1) ZERO_THROW(InvalidArgument, "DistEnv.world_size={} must be >= 1", env.world_size);
  if (env.rank < 0 || env.rank >= env.world_size) {
    ZERO_THROW(InvalidArgument, "DistEnv.rank={} is out of range for world_size={}", env.rank, env.world_size);
  }
  if (timeout <= std::chrono::milliseconds(0)) {
    ZERO_THROW(InvalidArgument, "connect_store: timeout must be positive, got {} ms", timeout.count());
  }
  if (env.world_size == 1) return std::make_shared<MemoryStore>();

  TcpStoreOptions o;
  o.host = env.master_addr;
  o.port = env.master_port;
  o.token = env.token;
  o.timeout = timeout;
  o.is_server = env.rank == 0 && !env.store_in_launcher;
  // A failing rank 0 keeps the store up while the others may still be failing and reporting: past
  // their deadline and the failure report's grace.
  o.linger_on_failure = timeout + std::chrono::seconds(5);
  if (o.port == 0) {
    ZERO_THROW(InvalidArgument, "connect_store: DistEnv.master_port is 0 for world size {}", env.world_size);
  }
  if (o.is_server && env.world_size > env.local_world_size && resolves_to_loopback(env.master_addr)) {
    // Classic multi-node pitfall: /etc/hosts maps the host's own name to 127.0.1.1.
    ZERO_LOG_WARN(
        "MASTER_ADDR={} resolves to a loopback address on rank 0, but ranks on other nodes must "
        "reach the store: set MASTER_ADDR to this node's network address",
        env.master_addr);
  }
  std::shared_ptr<Store> store = std::make_shared<TcpStore>(o);
  if (!env.store_prefix.empty()) return std::make_shared<PrefixStore>(env.store_prefix, std::move(store));
  return store;
}

}  // namespace zero::comm
