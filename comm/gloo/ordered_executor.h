#pragma once
// Runs a communicator's operations one at a time, in issue order, and completes their work handles.
//
// submit() numbers each operation (0, 1, ...) and queues it; one worker thread runs them one at a
// time in issue order while the caller computes. A caller that waits, with at least the default
// timeout, for an operation that is next in line and not started yet runs it on its own thread
// instead (see OrderedWork::wait in the .cc for why); issue order is kept either way.
//
// Failures: an operation that ends with an error completes its handle with that error
// (CommError/TimeoutError carrying the operation's message) and fails the executor: queued and later
// operations fail fast with CommError. A Work::wait(timeout) past its deadline throws TimeoutError
// and fails the executor too, and the operation running then is cut short (Owner::cut_short).
// Shutdown fails queued operations with "communicator destroyed", cuts short the one running, and
// waits for it to end. The messages speak of "the communicator": this runs a communicator's calls.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace zero::comm {

// How an operation ended.
enum class Outcome { kOk, kCommError, kTimeout };

struct OpResult {
  Outcome outcome = Outcome::kOk;
  std::string message;  // a failure's whole message (the operation's name included)
};

class OrderedExecutor {
 public:
  // The executor's calls back into the owner of the operations (the communicator).
  class Owner {
   public:
    // Cuts short the operation running now (on the worker or inline on a waiting caller), so that it
    // ends at once, failed, instead of running into its own timeout. Called with the executor's lock
    // held: must not call back into the executor.
    virtual void cut_short(const std::string& reason) = 0;
    // Appended to the TimeoutError of a caller who gave up on operation `seq` (the communicator: which
    // ranks never reached it). Shutdown waits for it to return.
    virtual std::string abandoned_note(uint64_t seq) = 0;
    // The executor failed (first failure only; not at shutdown), for whatever else the owner runs
    // beside it (the communicator's point-to-point transfers) to fail too. Called with the
    // executor's lock held: must not call back into the executor.
    virtual void failed(const std::string& reason) { (void)reason; }

   protected:
    ~Owner() = default;
  };

  struct Operation {
    // Names the operation in every message: "gloo rank 1: all_reduce(fp32, 1024, sum) #7".
    std::string what;
    // Runs it (on the worker, or on a waiting caller's thread); gets `what`. Must not throw: a
    // failure is an outcome and a message.
    std::function<OpResult(const std::string& what)> run;
  };

  // `default_timeout`: what Work::wait() waits, and the least timeout that runs an operation inline.
  // The worker starts here.
  OrderedExecutor(std::chrono::milliseconds default_timeout, Owner& owner);
  // shutdown().
  ~OrderedExecutor();
  OrderedExecutor(const OrderedExecutor&) = delete;
  OrderedExecutor& operator=(const OrderedExecutor&) = delete;

  // Issues the next operation: prepare(seq) builds it under the executor's lock (so sequence numbers
  // follow issue order; keep it quick, and it must not call back into the executor). Throws CommError
  // "<what> rejected: communicator failed earlier: <first failure>" once the executor has failed,
  // and "<what> rejected: communicator destroyed" after shutdown.
  WorkHandle submit(const std::function<Operation(uint64_t seq)>& prepare);

  // Fails the executor from outside (the first failure wins): queued and later operations fail
  // fast with CommError carrying `reason`, and the operation running now is cut short. No effect
  // after shutdown.
  void fail(const std::string& reason);

  // Queued operations fail with "communicator destroyed"; one running is cut short ("the communicator
  // was destroyed while it ran") and waited for, as is a caller's abandoned_note in progress. No Owner
  // call comes after it returns; handles stay valid. Idempotent.
  void shutdown();

 private:
  class Core;
  std::unique_ptr<Core> core_;
};

}  // namespace zero::comm
