#include "comm/launch/launch_rank_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace zero::comm {

namespace {

// What the child needs after fork, prepared before it so that the child only makes system calls.
struct ChildSetup {
  std::vector<char*> argv;
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

// Null-terminated pointers into strings that outlive the exec.
std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

std::optional<RankProcess> spawn_rank(int rank, const std::vector<std::string>& command,
                                      const std::vector<std::string>& env, int inherit_fd) {
  ChildSetup setup;
  setup.argv = c_strings(command);
  setup.envp = c_strings(env);
  setup.inherit_fd = inherit_fd;
  setup.parent = ::getpid();

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    say(fmt::format("pipe: {}", std::strerror(errno)));
    return std::nullopt;
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    say(fmt::format("pipe: {}", std::strerror(errno)));
    ::close(out[0]);
    ::close(out[1]);
    return std::nullopt;
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
    return std::nullopt;
  }
  ::setpgid(pid, pid);  // also done by the child; whichever runs first wins the race harmlessly
  const std::string prefix = fmt::format("[rank {}] ", rank);
  RankProcess r;
  r.rank = rank;
  r.pid = pid;
  r.running = true;
  r.out = RankOutputStream{out[0], STDOUT_FILENO, prefix, {}};
  r.err = RankOutputStream{err[0], STDERR_FILENO, prefix, {}};
  set_nonblocking(out[0]);
  set_nonblocking(err[0]);
  return r;
}

void signal_rank(const RankProcess& r, int sig) {
  if (::kill(-r.pid, sig) != 0) ::kill(r.pid, sig);
}

std::optional<int> reap_if_exited(RankProcess& r) {
  int status = 0;
  if (::waitpid(r.pid, &status, WNOHANG) != r.pid) return std::nullopt;
  r.running = false;
  return status;
}

}  // namespace zero::comm
