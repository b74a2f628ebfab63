#include "testing/launch.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/check.h"

namespace zero::testing {

namespace {

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

LaunchResult run(const std::string& program, const std::vector<std::string>& args, int timeout_s) {
  std::string cmd = "timeout -k 5 " + std::to_string(timeout_s) + " " + quote(program);
  for (const std::string& a : args) cmd += " " + quote(a);
  cmd += " 2>&1";
  LaunchResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) ZERO_THROW(IoError, "cannot run '{}'", cmd);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

LaunchResult launch(int nproc, const std::string& program, const std::vector<std::string>& args,
                    int timeout_s) {
  std::vector<std::string> all{"--nproc-per-node", std::to_string(nproc), "--master-port", "0", "--", program};
  all.insert(all.end(), args.begin(), args.end());
  return run("comm/launch/zerorun", all, timeout_s);
}

}  // namespace zero::testing
