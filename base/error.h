#pragma once
// Error types shared by every layer.
//
// Two kinds of failure: programming errors (a violated precondition, reported by the ZERO_CHECK macros
// in base/check.h as CheckError) and recoverable faults, each with its own type so that callers can
// catch what they can handle: bad input, a timeout, a communication failure, an I/O failure, an
// allocation that cannot be satisfied. Library code throws; it never exits or aborts on input.
#include <exception>
#include <stdexcept>
#include <string>

namespace zero {

// Base of every exception the library throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A violated internal invariant or precondition (see ZERO_CHECK).
class CheckError : public Error {
 public:
  using Error::Error;
};

// The caller passed something unusable: a bad option, a size, a shape, a name.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A blocking wait ran past its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer failed, a connection broke, or ranks disagree about a collective.
class CommError : public Error {
 public:
  using Error::Error;
};

// Reading or writing a file or socket failed.
class IoError : public Error {
 public:
  using Error::Error;
};

// An allocation could not be satisfied (too large, overflowing, or refused by the system).
class AllocationError : public Error {
 public:
  using Error::Error;
};

// The message of a captured exception (what() for a std::exception), for errors that report a
// failure which happened on another thread.
inline std::string exception_message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace zero
