#pragma once
// Everything zerorun writes: its own messages ("zerorun: ..." on stderr) and the ranks' output,
// re-emitted line by line with a "[rank R] " prefix so that interleaved ranks stay readable.
#include <cstddef>
#include <string>

namespace zero::comm {

// A line longer than this is emitted in pieces (each with the prefix) to bound memory.
inline constexpr size_t kMaxRankLineBytes = 64 * 1024;

// Writes all of s, retrying EINTR; gives up quietly when fd is gone (EPIPE): zerorun's own output
// closing must not stop it from supervising the ranks.
void write_all(int fd, const std::string& s);

// One of zerorun's own messages: "zerorun: <message>\n" on stderr.
void say(const std::string& message);

// One of a rank's output pipes (stdout or stderr), re-emitted on `dest` with `prefix` on every
// line. Lines are kept whole: bytes after the last newline wait for the rest of their line.
// A plain value (no destructor): the supervisor decides when the pipe is closed.
struct RankOutputStream {
  int fd = -1;  // read end, non-blocking; -1 once closed
  int dest = -1;
  std::string prefix;
  std::string pending;  // bytes after the last newline

  // Reads what is available now (bounded, so one chatty rank cannot starve the others). Returns
  // false at EOF or on a read error, after closing.
  bool read_available();
  // Emits an unterminated last line (with a newline added) and closes the pipe.
  void close();

 private:
  void emit_lines();
  void flush_partial();
};

}  // namespace zero::comm
