#include "comm/launch/launch_output.h"

#include <unistd.h>

#include <cerrno>

namespace zero::comm {

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

void RankOutputStream::emit_lines() {
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
  if (pending.size() >= kMaxRankLineBytes) {
    out += prefix + pending + "\n";
    pending.clear();
  }
  if (!out.empty()) write_all(dest, out);
}

void RankOutputStream::flush_partial() {
  if (!pending.empty()) write_all(dest, prefix + pending + "\n");
  pending.clear();
}

bool RankOutputStream::read_available() {
  char buf[16384];
  for (int rounds = 0; rounds < 64; ++rounds) {
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

void RankOutputStream::close() {
  flush_partial();
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace zero::comm
