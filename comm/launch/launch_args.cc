#include "comm/launch/launch_args.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <set>

#include "base/check.h"

namespace zero::comm {

namespace {

constexpr int kMaxProcsPerNode = 4096;
constexpr int kMaxNodes = 1 << 16;

int parse_int_flag(const std::string& flag, const std::string& value, int lo, int hi) {
  int out = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (value.empty() || ec != std::errc() || ptr != end) {
    ZERO_THROW(InvalidArgument, "{}: '{}' is not an integer", flag, value);
  }
  if (out < lo || out > hi) ZERO_THROW(InvalidArgument, "{}={} is out of range [{}, {}]", flag, out, lo, hi);
  return out;
}

double parse_seconds_flag(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(v)) {
    ZERO_THROW(InvalidArgument, "{}: '{}' is not a number of seconds", flag, value);
  }
  if (v < 0) ZERO_THROW(InvalidArgument, "{}={} must not be negative", flag, value);
  return v;
}

}  // namespace

const char* launch_usage() {
  return "usage: zerorun [--nproc-per-node N] [--nnodes M] [--node-rank K] [--master-addr A]\n"
         "               [--master-port P] [--timeout-s S] [--grace-s S] [--report-s S]\n"
         "               [--max-restarts N] [--min-nproc M] [--heartbeat-s S] -- program [args...]\n"
         "  --nproc-per-node N  ranks on this node (default 1)\n"
         "  --nnodes M          nodes in the job (default 1); more than one needs --master-addr,\n"
         "                      --master-port and the same ZERO_JOB_TOKEN exported on every node;\n"
         "                      MIN:MAX with --max-restarts: go on with as few as MIN nodes\n"
         "  --node-rank K       this node's index, 0..M-1 (default 0)\n"
         "  --master-addr A     address of the rendezvous store, which node 0's zerorun hosts\n"
         "                      (default 127.0.0.1)\n"
         "  --master-port P     its port; 0 (default, single node) picks a free one\n"
         "  --timeout-s S       stop the job after S seconds and exit 124 (default 0: no limit)\n"
         "  --grace-s S         SIGTERM-to-SIGKILL delay when tearing down (default 3)\n"
         "  --report-s S        after a rank fails, time the others have to exit on their own (and\n"
         "                      report what they saw) before SIGTERM (default 5)\n"
         "  --max-restarts N    after a rank fails, start the job again without it, up to N times\n"
         "                      (default 0): the program resumes (train_gpt --resume auto)\n"
         "  --min-nproc M       restart only while at least M ranks are left on this node (default 1)\n"
         "  --join-timeout-s S  several nodes: how long node 0 waits for every node to join a\n"
         "                      restarted attempt before going on without the missing ones (default 30)\n"
         "  --heartbeat-s S     a rank whose heartbeat stops for S seconds (a stopped process) is\n"
         "                      killed and counts as failed (default 0: not watched)\n"
         "Every rank's output lines are prefixed with \"[rank R] \". See docs/launcher.md.\n";
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions o;
  bool min_nnodes_given = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      o.help = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) {
      if (!a.empty() && a[0] == '-') ZERO_THROW(InvalidArgument, "unknown flag '{}'", a);
      break;  // the program
    }
    std::string name = a.substr(0, a.find('='));
    for (char& c : name) {
      if (c == '_') c = '-';  // torchrun spells them --nproc_per_node
    }
    static const std::set<std::string> kKnown = {"--nproc-per-node", "--nnodes", "--node-rank",
                                                 "--master-addr", "--master-port", "--timeout-s",
                                                 "--grace-s", "--report-s", "--max-restarts",
                                                 "--min-nproc", "--heartbeat-s", "--join-timeout-s"};
    if (kKnown.count(name) == 0) ZERO_THROW(InvalidArgument, "unknown flag '{}'", a);
    std::string value;
    if (a.find('=') != std::string::npos) {
      value = a.substr(a.find('=') + 1);
    } else {
      if (i + 1 >= args.size()) ZERO_THROW(InvalidArgument, "{} needs a value", name);
      value = args[++i];
    }
    if (name == "--nproc-per-node") o.nproc_per_node = parse_int_flag(name, value, 1, kMaxProcsPerNode);
    if (name == "--nnodes") {
      const size_t colon = value.find(':');
      o.nnodes = parse_int_flag(name, value.substr(colon == std::string::npos ? 0 : colon + 1), 1, kMaxNodes);
      o.min_nnodes = colon == std::string::npos ? o.nnodes : parse_int_flag(name + " (MIN)", value.substr(0, colon), 1, kMaxNodes);
      min_nnodes_given = colon != std::string::npos;
    }
    if (name == "--join-timeout-s") o.join_timeout_s = parse_seconds_flag(name, value);
    if (name == "--node-rank") o.node_rank = parse_int_flag(name, value, 0, kMaxNodes - 1);
    if (name == "--master-port") o.master_port = parse_int_flag(name, value, 0, 65535);
    if (name == "--timeout-s") o.timeout_s = parse_seconds_flag(name, value);
    if (name == "--grace-s") o.grace_s = parse_seconds_flag(name, value);
    if (name == "--report-s") o.report_s = parse_seconds_flag(name, value);
    if (name == "--max-restarts") o.max_restarts = parse_int_flag(name, value, 0, 1000);
    if (name == "--min-nproc") o.min_nproc = parse_int_flag(name, value, 1, kMaxProcsPerNode);
    if (name == "--heartbeat-s") o.heartbeat_s = parse_seconds_flag(name, value);
    if (name == "--master-addr") {
      if (value.empty()) ZERO_THROW(InvalidArgument, "--master-addr is empty");
      o.master_addr = value;
      o.master_addr_given = true;
    }
  }
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (o.help) return o;
  if (o.command.empty()) ZERO_THROW(InvalidArgument, "no program to run (zerorun [flags] -- program args...)");
  if (o.node_rank >= o.nnodes) {
    ZERO_THROW(InvalidArgument, "--node-rank={} must be less than --nnodes={}", o.node_rank, o.nnodes);
  }
  if (o.nnodes > 1 && o.master_port == 0) {
    ZERO_THROW(InvalidArgument, "--master-port is required when --nnodes={} (> 1)", o.nnodes);
  }
  if (o.nnodes > 1 && !o.master_addr_given) {
    ZERO_THROW(InvalidArgument, "--master-addr is required when --nnodes={} (> 1)", o.nnodes);
  }
  if (o.min_nnodes > o.nnodes) {
    ZERO_THROW(InvalidArgument, "--nnodes {}:{}: MIN is more than MAX", o.min_nnodes, o.nnodes);
  }
  if (min_nnodes_given && o.min_nnodes < o.nnodes && o.max_restarts == 0) {
    ZERO_THROW(InvalidArgument, "--nnodes {}:{}: a node range needs --max-restarts (a job without restarts never "
               "goes on with fewer nodes)", o.min_nnodes, o.nnodes);
  }
  if (o.min_nproc > o.nproc_per_node) {
    ZERO_THROW(InvalidArgument, "--min-nproc={} is more than --nproc-per-node={}", o.min_nproc, o.nproc_per_node);
  }
  if (static_cast<int64_t>(o.nnodes) * o.nproc_per_node > (int64_t{1} << 24)) {
    ZERO_THROW(InvalidArgument, "--nnodes={} x --nproc-per-node={} ranks is too many", o.nnodes,
               o.nproc_per_node);
  }
  return o;
}

}  // namespace zero::comm
