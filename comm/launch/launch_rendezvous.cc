#include "comm/launch/launch_rendezvous.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/check.h"

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

}  // namespace

Rendezvous prepare_rendezvous(const LaunchOptions& o, const std::string& exported_token) {
  Rendezvous r;
  // The token must be the same on every node: with several nodes the user exports it.
  r.token = exported_token;
  if (r.token.empty()) {
    if (o.nnodes > 1) {
      ZERO_THROW(InvalidArgument,
                 "--nnodes={} needs the same ZERO_JOB_TOKEN exported on every node (e.g. "
                 "export ZERO_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'))",
                 o.nnodes);
    }
    r.token = random_token();
  }
  // Port 0: bind here, hand the socket to rank 0 (no window for another process to take the port).
  r.port = static_cast<uint16_t>(o.master_port);
  if (r.port == 0) r.listen_fd = listen_on_free_port(o.master_addr, &r.port);
  return r;
}

}  // namespace zero::comm
