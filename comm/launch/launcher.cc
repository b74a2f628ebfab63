// zerorun: a small torchrun-style launcher.
//
// Process model: every rank is forked into its own process group (so that a rank's own children are
// signalled with it, and so that a terminal's Ctrl-C reaches zerorun only, which forwards it once),
// with stdout/stderr on pipes that one poll loop reads and re-emits line by line with a
// "[rank R] " prefix. Signals reach the loop through a self-pipe. Ranks get PR_SET_PDEATHSIG so that
// they die with zerorun even if it is killed with SIGKILL.
#include "comm/launch/launcher.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>

#include "base/check.h"
#include "comm/store/tcp_store_socket.h"

extern char** environ;

namespace zero::comm {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxProcsPerNode = 4096;
constexpr int kMaxNodes = 1 << 16;
// A line longer than this is emitted in pieces (each with the prefix) to bound memory.
constexpr size_t kMaxLineBytes = 64 * 1024;

// ---------------------------------------------------------------------------------------------
// Arguments

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

// ---------------------------------------------------------------------------------------------
// Signals: handlers only record the signal and poke the self-pipe.

std::atomic<int> g_forward_signal{0};
std::atomic<int> g_signal_count{0};
int g_wake_fd = -1;

void on_signal(int sig) {
  const int saved = errno;
  if (sig != SIGCHLD) {
    g_forward_signal.store(sig);
    g_signal_count.fetch_add(1);
  }
  if (g_wake_fd >= 0) {
    const char byte = 0;
    [[maybe_unused]] const ssize_t n = ::write(g_wake_fd, &byte, 1);
  }
  errno = saved;
}

// Installs the handlers for the duration of a launch and restores the previous ones.
class SignalScope {
 public:
  explicit SignalScope(int wake_fd) {
    g_wake_fd = wake_fd;
    g_forward_signal = 0;
    g_signal_count = 0;
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (int i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
    // A closed stdout must not kill the launcher while ranks still run.
    struct sigaction ign{};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, &old_pipe_);
  }
  ~SignalScope() {
    for (int i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    g_wake_fd = -1;
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  static constexpr int kCount = 4;
  static constexpr int kSignals[kCount] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
  struct sigaction old_[kCount] {};
  struct sigaction old_pipe_ {};
};

// ---------------------------------------------------------------------------------------------
// Helpers

std::string random_token() {
  net::Fd fd(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) ZERO_THROW(IoError, "zerorun: cannot open /dev/urandom: {}", std::strerror(errno));
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::read(fd.get(), bytes + got, sizeof(bytes) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ZERO_THROW(IoError, "zerorun: cannot read /dev/urandom: {}", std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

// A listening socket on host with a kernel-chosen port (close-on-exec; rank 0 inherits it).
net::Fd listen_on_free_port(const std::string& host, uint16_t* port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "0", &hints, &list);
  if (rc != 0) ZERO_THROW(InvalidArgument, "--master-addr={}: cannot resolve: {}", host, ::gai_strerror(rc));
  std::string error = "no address";
  net::Fd result;
  for (addrinfo* ai = list; ai != nullptr && !result.valid(); ai = ai->ai_next) {
    net::Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    const int one = 1;
    if (fd.valid() && ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        ::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd.get(), SOMAXCONN) == 0) {
      result = std::move(fd);
    } else {
      error = std::strerror(errno);
    }
  }
  ::freeaddrinfo(list);
  if (!result.valid()) ZERO_THROW(InvalidArgument, "--master-addr={}: cannot listen there: {}", host, error);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(result.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  *port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return result;
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone (EPIPE): nothing sensible to do
    off += static_cast<size_t>(n);
  }
}

void say(const std::string& message) { write_all(STDERR_FILENO, "zerorun: " + message + "\n"); }

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::sigabbrev_np(sig);
    return fmt::format("was killed by signal {} (SIG{})", sig, name ? name : "?");
  }
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

int exit_code_of(int status) {
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

// One of a rank's output pipes, re-emitted line by line with the prefix.
struct Stream {
  int fd = -1;  // read end, non-blocking; -1 once closed
  int dest = STDOUT_FILENO;
  std::string prefix;
  std::string pending;  // bytes after the last newline

  void emit_lines() {
    size_t start = 0;
    std::string out;
    for (;;) {
      const size_t nl = pending.find('\n', start);
      if (nl == std::string::npos) break;
      out += prefix;
      out.append(pending, start, nl - start + 1);
      start = nl + 1;
    }
    pending.erase(0, start);
    if (pending.size() >= kMaxLineBytes) {
      out += prefix + pending + "\n";
      pending.clear();
    }
    if (!out.empty()) write_all(dest, out);
  }

  void flush_partial() {
    if (!pending.empty()) write_all(dest, prefix + pending + "\n");
    pending.clear();
  }

  // Reads what is available now. Returns false at EOF (and closes).
  bool read_available() {
    char buf[16384];
    for (int rounds = 0; rounds < 64; ++rounds) {  // bounded, so one chatty rank cannot starve others
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n > 0) {
        pending.append(buf, static_cast<size_t>(n));
        emit_lines();
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      close();  // EOF or a read error
      return false;
    }
    return true;
  }

  void close() {
    flush_partial();
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct Rank {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
};

// Signals the rank's whole process group (its own children included).
void signal_rank(const Rank& r, int sig) {
  if (::kill(-r.pid, sig) != 0) ::kill(r.pid, sig);
}

struct ChildSetup {
  std::vector<char*> argv;
  std::vector<std::string> env_storage;
  std::vector<char*> envp;
  int stdout_fd = -1, stderr_fd = -1;
  int inherit_fd = -1;  // cleared close-on-exec so that exec keeps it
  pid_t parent = 0;
};

[[noreturn]] void exec_child(const ChildSetup& s) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != s.parent) ::_exit(127);  // zerorun died before prctl
  ::dup2(s.stdout_fd, STDOUT_FILENO);
  ::dup2(s.stderr_fd, STDERR_FILENO);
  const int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
  if (s.inherit_fd >= 0) ::fcntl(s.inherit_fd, F_SETFD, 0);
  // The program starts with default dispositions and an empty mask, not the launcher's.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execvpe(s.argv[0], s.argv.data(), s.envp.data());
  const std::string msg =
      fmt::format("zerorun: cannot execute '{}': {}\n", s.argv[0], std::strerror(errno));
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg.data(), msg.size());
  ::_exit(127);
}

// The parent environment minus the variables zerorun sets, plus those.
std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& set) {
  static const std::set<std::string> kOwned = {
      "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
      "GROUP_RANK", "ZERO_JOB_TOKEN", "ZERO_STORE_LISTEN_FD"};
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (kOwned.count(name) == 0) out.push_back(entry);
  }
  for (const auto& [k, v] : set) out.push_back(k + "=" + v);
  return out;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

const char* launch_usage() {
  return "usage: zerorun [--nproc-per-node N] [--nnodes M] [--node-rank K] [--master-addr A]\n"
         "               [--master-port P] [--timeout-s S] [--grace-s S] [--report-s S] -- program [args...]\n"
         "  --nproc-per-node N  ranks on this node (default 1)\n"
         "  --nnodes M          nodes in the job (default 1); more than one needs --master-addr,\n"
         "                      --master-port and the same ZERO_JOB_TOKEN exported on every node\n"
         "  --node-rank K       this node's index, 0..M-1 (default 0)\n"
         "  --master-addr A     address of rank 0's store (default 127.0.0.1)\n"
         "  --master-port P     its port; 0 (default, single node) picks a free one\n"
         "  --timeout-s S       stop the job after S seconds and exit 124 (default 0: no limit)\n"
         "  --grace-s S         SIGTERM-to-SIGKILL delay when tearing down (default 3)\n"
         "  --report-s S        after a rank fails, time the others have to exit on their own (and\n"
         "                      report what they saw) before SIGTERM (default 5)\n"
         "Every rank's output lines are prefixed with \"[rank R] \". See docs/launcher.md.\n";
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions o;
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
                                                 "--grace-s", "--report-s"};
    if (kKnown.count(name) == 0) ZERO_THROW(InvalidArgument, "unknown flag '{}'", a);
    std::string value;
    if (a.find('=') != std::string::npos) {
      value = a.substr(a.find('=') + 1);
    } else {
      if (i + 1 >= args.size()) ZERO_THROW(InvalidArgument, "{} needs a value", name);
      value = args[++i];
    }
    if (name == "--nproc-per-node") o.nproc_per_node = parse_int_flag(name, value, 1, kMaxProcsPerNode);
    if (name == "--nnodes") o.nnodes = parse_int_flag(name, value, 1, kMaxNodes);
    if (name == "--node-rank") o.node_rank = parse_int_flag(name, value, 0, kMaxNodes - 1);
    if (name == "--master-port") o.master_port = parse_int_flag(name, value, 0, 65535);
    if (name == "--timeout-s") o.timeout_s = parse_seconds_flag(name, value);
    if (name == "--grace-s") o.grace_s = parse_seconds_flag(name, value);
    if (name == "--report-s") o.report_s = parse_seconds_flag(name, value);
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
  if (static_cast<int64_t>(o.nnodes) * o.nproc_per_node > (int64_t{1} << 24)) {
    ZERO_THROW(InvalidArgument, "--nnodes={} x --nproc-per-node={} ranks is too many", o.nnodes,
               o.nproc_per_node);
  }
  return o;
}

int run_launch(const LaunchOptions& o) {
  ZERO_CHECK(!o.command.empty(), "run_launch: no program");
  const int world = o.nnodes * o.nproc_per_node;

  // The token must be the same on every node: with several nodes the user exports it.
  std::string token = std::getenv("ZERO_JOB_TOKEN") ? std::getenv("ZERO_JOB_TOKEN") : "";
  if (token.empty()) {
    if (o.nnodes > 1) {
      ZERO_THROW(InvalidArgument,
                 "--nnodes={} needs the same ZERO_JOB_TOKEN exported on every node (e.g. "
                 "export ZERO_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'))",
                 o.nnodes);
    }
    token = random_token();
  }

  // Port 0: bind here, hand the socket to rank 0 (no window for another process to take the port).
  net::Fd listen_fd;
  uint16_t port = static_cast<uint16_t>(o.master_port);
  if (port == 0) listen_fd = listen_on_free_port(o.master_addr, &port);

  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    ZERO_THROW(IoError, "zerorun: pipe: {}", std::strerror(errno));
  }
  net::Fd wake_read(wake[0]), wake_write(wake[1]);
  SignalScope signals(wake_write.get());

  std::vector<char*> argv;
  for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  std::vector<Rank> ranks(static_cast<size_t>(o.nproc_per_node));
  bool start_failed = false;
  for (int local = 0; local < o.nproc_per_node; ++local) {
    Rank& r = ranks[static_cast<size_t>(local)];
    r.local_rank = local;
    r.rank = o.node_rank * o.nproc_per_node + local;
    std::vector<std::pair<std::string, std::string>> vars = {
        {"MASTER_ADDR", o.master_addr},
        {"MASTER_PORT", std::to_string(port)},
        {"RANK", std::to_string(r.rank)},
        {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(local)},
        {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
        {"GROUP_RANK", std::to_string(o.node_rank)},
        {"ZERO_JOB_TOKEN", token},
    };
    const bool gets_socket = listen_fd.valid() && r.rank == 0;
    if (gets_socket) vars.emplace_back("ZERO_STORE_LISTEN_FD", std::to_string(listen_fd.get()));

    ChildSetup setup;
    setup.argv = argv;
    setup.env_storage = child_environment(vars);
    for (auto& e : setup.env_storage) setup.envp.push_back(e.data());
    setup.envp.push_back(nullptr);
    setup.inherit_fd = gets_socket ? listen_fd.get() : -1;
    setup.parent = ::getpid();

    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      say(fmt::format("pipe: {}", std::strerror(errno)));
      start_failed = true;
      break;
    }
    if (::pipe2(err, O_CLOEXEC) != 0) {
      say(fmt::format("pipe: {}", std::strerror(errno)));
      ::close(out[0]);
      ::close(out[1]);
      start_failed = true;
      break;
    }
    setup.stdout_fd = out[1];
    setup.stderr_fd = err[1];
    const pid_t pid = ::fork();
    if (pid == 0) exec_child(setup);
    ::close(out[1]);
    ::close(err[1]);
    if (pid < 0) {
      say(fmt::format("fork: {}", std::strerror(errno)));
      ::close(out[0]);
      ::close(err[0]);
      start_failed = true;
      break;
    }
    ::setpgid(pid, pid);  // also done by the child; whichever runs first wins the race harmlessly
    r.pid = pid;
    r.running = true;
    const std::string prefix = fmt::format("[rank {}] ", r.rank);
    r.out = Stream{out[0], STDOUT_FILENO, prefix, {}};
    r.err = Stream{err[0], STDERR_FILENO, prefix, {}};
    set_nonblocking(out[0]);
    set_nonblocking(err[0]);
  }
  listen_fd.reset();  // rank 0 holds its own copy now

  enum class Reason { kNone, kRankFailed, kSignal, kTimeout, kStartFailed };
  Reason reason = start_failed ? Reason::kStartFailed : Reason::kNone;
  int exit_code = start_failed ? 1 : 0;
  const auto start = Clock::now();
  const auto grace = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_s));
  Clock::time_point kill_at = Clock::time_point::max();
  Clock::time_point term_at = Clock::time_point::max();  // a rank failed: SIGTERM the rest then
  bool killed = false;
  int signals_seen = 0;

  auto any_running = [&] {
    for (const auto& r : ranks) {
      if (r.running) return true;
    }
    return false;
  };
  auto teardown = [&](int sig) {
    for (const auto& r : ranks) {
      if (r.running) signal_rank(r, sig);
    }
    if (kill_at == Clock::time_point::max()) kill_at = Clock::now() + grace;
  };
  if (start_failed) teardown(SIGTERM);

  while (any_running()) {
    // Wait for output, a signal or a child exit (SIGCHLD pokes the self-pipe).
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    fds.push_back({wake_read.get(), POLLIN, 0});
    for (auto& r : ranks) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
    }
    auto wake_at = Clock::now() + std::chrono::milliseconds(200);
    if (!killed && kill_at < wake_at) wake_at = kill_at;
    if (term_at < wake_at) wake_at = term_at;
    const int rc = ::poll(fds.data(), fds.size(), net::poll_timeout_ms(wake_at));
    if (rc > 0) {
      if (fds[0].revents != 0) {
        char drain[64];
        while (::read(wake_read.get(), drain, sizeof(drain)) > 0) {
        }
      }
      for (size_t k = 1; k < fds.size(); ++k) {
        if (fds[k].revents != 0) streams[k - 1]->read_available();
      }
    }

    // Forward SIGINT/SIGTERM/SIGHUP; a second one escalates to SIGKILL at once.
    const int count = g_signal_count.load();
    if (count > signals_seen) {
      const int sig = g_forward_signal.load();
      signals_seen = count;
      if (reason == Reason::kNone) {
        reason = Reason::kSignal;
        exit_code = 128 + sig;
        const char* name = ::sigabbrev_np(sig);
        say(fmt::format("got signal {} (SIG{}); forwarding it to the ranks", sig, name ? name : "?"));
        teardown(sig);
      } else {
        say("got another signal; killing the ranks");
        kill_at = Clock::now();
      }
    }

    // Reap.
    for (auto& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      const pid_t p = ::waitpid(r.pid, &status, WNOHANG);
      if (p != r.pid) continue;
      r.running = false;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && reason == Reason::kNone) {
        reason = Reason::kRankFailed;
        exit_code = exit_code_of(status);
        say(fmt::format("rank {} (pid {}) {}; stopping the other ranks{}", r.rank, r.pid, describe_status(status),
                        o.report_s > 0 ? fmt::format(" (after up to {} s for them to report)", o.report_s) : ""));
        term_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.report_s));
      } else if (failed && reason == Reason::kRankFailed) {
        say(fmt::format("rank {} (pid {}) {}", r.rank, r.pid, describe_status(status)));
      }
    }

    if (term_at != Clock::time_point::max() && Clock::now() >= term_at) {
      term_at = Clock::time_point::max();
      teardown(SIGTERM);
    }

    // Job time limit.
    if (reason == Reason::kNone && o.timeout_s > 0 &&
        Clock::now() - start >= std::chrono::duration<double>(o.timeout_s)) {
      reason = Reason::kTimeout;
      exit_code = 124;
      say(fmt::format("the job ran past --timeout-s={}; stopping the ranks", o.timeout_s));
      teardown(SIGTERM);
    }

    if (!killed && any_running() && Clock::now() >= kill_at) {
      say(fmt::format("ranks still running {} s after SIGTERM; sending SIGKILL", o.grace_s));
      for (const auto& r : ranks) {
        if (r.running) signal_rank(r, SIGKILL);
      }
      killed = true;
    }
  }

  // Every rank has exited. Their leftover children (still in the ranks' process groups) would keep
  // the pipes open: stop them, then take what output is already there without waiting for EOF.
  for (const auto& r : ranks) {
    if (r.pid > 0) ::kill(-r.pid, SIGKILL);
  }
  for (auto& r : ranks) {
    for (Stream* s : {&r.out, &r.err}) {
      if (s->fd >= 0) s->read_available();
      if (s->fd >= 0) s->close();
    }
  }
  return exit_code;
}

}  // namespace zero::comm
