#pragma once
// Where the ranks meet: the job token that admits a rank to the rendezvous store, and the store
// itself, which node 0's zerorun hosts rather than rank 0, so that a rank that dies takes no
// rendezvous along, and each attempt of an elastic job (--max-restarts) meets at a fresh store.
#include <memory>
#include <string>

#include "comm/launch/launch_args.h"
#include "comm/store/tcp_store.h"

namespace zero::comm {

// exported_token (the caller's ZERO_JOB_TOKEN, empty when unset) or, on a single node, a fresh random
// one. Throws InvalidArgument for a multi-node job without a token, IoError when /dev/urandom
// cannot be read.
std::string job_token(const LaunchOptions& options, const std::string& exported_token);

// Node 0's store for one attempt of the job on --master-addr:--master-port (a free port for 0:
// TcpStoreServer::port), served from its own thread with zerorun's signals blocked. Throws CommError
// naming the address when it cannot be bound.
std::unique_ptr<TcpStoreServer> host_rendezvous_store(const LaunchOptions& options, const std::string& token);

}  // namespace zero::comm
