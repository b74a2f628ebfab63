#pragma once
// Where the ranks meet: rank 0's store address and port and the job token that admits a rank to
// it. Decided once per zerorun before any rank starts, because every rank must get the same values.
#include <cstdint>
#include <string>

#include "comm/launch/launch_args.h"
#include "comm/store/tcp_store_socket.h"

namespace zero::comm {

struct Rendezvous {
  std::string token;  // ZERO_JOB_TOKEN
  uint16_t port = 0;  // MASTER_PORT
  // With --master-port 0: the socket zerorun bound on a kernel-chosen port (close-on-exec), which
  // rank 0 inherits (ZERO_STORE_LISTEN_FD) so that no other process can take the port in between.
  // Invalid when the port was given.
  net::Fd listen_fd;
};

// Uses exported_token (the caller's ZERO_JOB_TOKEN, empty when unset) or, on a single node, a fresh
// random one; then binds a free port when none was given. Throws InvalidArgument for a multi-node
// job without a token or an unusable --master-addr, IoError when /dev/urandom cannot be read.
Rendezvous prepare_rendezvous(const LaunchOptions& options, const std::string& exported_token);

}  // namespace zero::comm
