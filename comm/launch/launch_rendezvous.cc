#include "comm/launch/launch_rendezvous.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/check.h"
#include "comm/store/tcp_store_socket.h"

namespace zero::comm {

namespace {

// 16 bytes of /dev/urandom as 32 hex digits.
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

}  // namespace

std::string job_token(const LaunchOptions& o, const std::string& exported_token) {
  // The token must be the same on every node: with several nodes the user exports it.
  if (exported_token.empty()) {
    if (o.nnodes > 1) {
      ZERO_THROW(InvalidArgument,
                 "--nnodes={} needs the same ZERO_JOB_TOKEN exported on every node (e.g. "
                 "export ZERO_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'))",
                 o.nnodes);
    }
    return random_token();
  }
  return exported_token;
}

std::unique_ptr<TcpStoreServer> host_rendezvous_store(const LaunchOptions& o, const std::string& token) {
  // The server's I/O thread starts with every signal blocked: zerorun's handlers and its SIGCHLD
  // stay with the supervisor's thread, whose poll they wake.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  std::unique_ptr<TcpStoreServer> server;
  try {
    server = std::make_unique<TcpStoreServer>(TcpStoreOptions{
        .host = o.master_addr, .port = static_cast<uint16_t>(o.master_port), .is_server = true, .token = token});
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return server;
}

}  // namespace zero::comm
