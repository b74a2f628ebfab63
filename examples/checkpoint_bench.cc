// Checkpoint speed per rank next to the disk's, measured in the same run:
//
//   bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/checkpoint_bench
//       [--params-m 64] [--stage 2] [--dir /tmp/zero_ckpt_bench] [--rounds 3]
//
// A synthetic fp32 model (Adam: a rank's part is 16Ψ/N bytes at stages 1-3, master + two states +
// parameters), then per round, on every rank at once: the disk (a file of the rank's checkpoint size
// written and fsynced, then read back), save() (synchronous) and load(). GB/s per rank = the rank's
// bytes / the slowest rank's time. The disk is measured both through the page cache and with
// O_DIRECT, and the checkpoint compared with the faster. Then the time an async save takes from training: the step time
// with a save_async() of the same checkpoint running against the step time without. Before every
// read (the disk's and load()'s) the files are dropped from the page cache (posix_fadvise
// DONTNEED after fsync), so reads come from the disk.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "tools/cli/flags.h"
#include "zero/engine.h"

namespace {

using namespace zero;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The slowest rank's time for `fn`, started together.
template <typename Fn>
double timed(comm::Communicator& comm, Fn&& fn) {
  comm.barrier()->wait();
  const auto t0 = Clock::now();
  fn();
  double s = seconds_since(t0);
  comm.all_reduce(&s, 1, DType::kFloat64, comm::ReduceOp::kMax)->wait();
  return s;
}

// An 8 MiB page-aligned buffer, what O_DIRECT needs.
struct IoBuffer {
  static constexpr size_t kBytes = size_t{8} << 20;
  std::unique_ptr<char, decltype(&std::free)> p{static_cast<char*>(std::aligned_alloc(4096, kBytes)), &std::free};
  IoBuffer() { std::memset(p.get(), 'z', kBytes); }
};

// The disk's sequential write: `bytes` (rounded up to the buffer) in 8 MiB writes, then fsync;
// through the page cache or with O_DIRECT.
void disk_write(const std::string& path, size_t bytes, bool direct) {
  IoBuffer buf;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
  ZERO_CHECK(fd >= 0, "cannot create {}{}", path, direct ? " with O_DIRECT" : "");
  for (size_t done = 0; done < bytes;) {
    const ssize_t w = ::write(fd, buf.p.get(), IoBuffer::kBytes);
    ZERO_CHECK(w > 0, "write to {} failed", path);
    done += static_cast<size_t>(w);
  }
  ZERO_CHECK(::fsync(fd) == 0, "fsync of {} failed", path);
  ::close(fd);
}

// Drops a written (fsynced) file's pages from the page cache, so the next read goes to the disk.
void uncache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void uncache_dir(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) uncache(e.path().string());
}

void disk_read(const std::string& path, size_t bytes, bool direct) {
  IoBuffer buf;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  ZERO_CHECK(fd >= 0, "cannot open {}", path);
  for (size_t done = 0; done < bytes;) {
    const ssize_t r = ::read(fd, buf.p.get(), IoBuffer::kBytes);
    ZERO_CHECK(r > 0, "read of {} failed", path);
    done += static_cast<size_t>(r);
  }
  ::close(fd);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const double millions = flags.get_double("params-m", 64.0);
  const int stage = flags.get_int("stage", 2);
  const std::string dir = flags.get("dir", "/tmp/zero_ckpt_bench");
  const int rounds = flags.get_int("rounds", 3);
  const int tensors = flags.get_int("tensors", 8);
  flags.check_all_used();

  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& comm = *pg.host;
  const int rank = comm.rank(), world = comm.size();
  EngineOptions opt;
  opt.stage = stage;
  opt.optimizer.kind = optim::OptimizerKind::kAdam;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-4f}};
  Engine engine(comm, opt);
  const size_t per = static_cast<size_t>(millions * 1e6) / static_cast<size_t>(tensors);
  std::vector<std::vector<float>> params(static_cast<size_t>(tensors), std::vector<float>(per, 0.5f));
  std::vector<int> ids;
  for (int t = 0; t < tensors; ++t) {
    ids.push_back(engine.add_param({.name = "w" + std::to_string(t), .shape = {static_cast<int64_t>(per)},
                                    .dtype = DType::kFloat32,
                                    .data = {params[static_cast<size_t>(t)].data(), per}, .unit = t}));
  }
  engine.finalize();
  auto train_step = [&] {
    for (int t = tensors; t-- > 0;) {
      auto scope = engine.gather_for_backward(t);
      float* g = scope.grad_as<float>(ids[static_cast<size_t>(t)]);
      for (size_t i = 0; i < per; i += 64) g[i] = 1e-3f;
    }
    engine.step();
  };
  train_step();

  const std::string ckpt = dir + "/ckpt";
  if (rank == 0) std::filesystem::create_directories(dir);
  comm.barrier()->wait();
  engine.save(ckpt);  // warm-up, and the size of this rank's part
  size_t bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(ckpt)) {
    if (e.path().filename() == fmt::format("rank-{:05d}.bin", rank)) bytes = std::filesystem::file_size(e.path());
  }
  const std::string scratch = fmt::format("{}/disk-{}.bin", dir, rank);
  std::vector<double> dw, dr, dwd, drd, sv, ld;
  for (int r = 0; r < rounds; ++r) {
    dw.push_back(timed(comm, [&] { disk_write(scratch, bytes, false); }));
    uncache(scratch);
    dr.push_back(timed(comm, [&] { disk_read(scratch, bytes, false); }));
    dwd.push_back(timed(comm, [&] { disk_write(scratch, bytes, true); }));
    drd.push_back(timed(comm, [&] { disk_read(scratch, bytes, true); }));
    sv.push_back(timed(comm, [&] { engine.save(ckpt); }));
    if (rank == 0) uncache_dir(ckpt);
    ld.push_back(timed(comm, [&] { engine.load(ckpt); }));
  }
  std::filesystem::remove(scratch);
  // Async: steps without a save, then the same number of steps with a save_async() issued first;
  // twice, since the first save also maps the engine's staging memory, which later saves reuse.
  const int steps = 5;
  struct AsyncRun {
    double plain = 0, with_save = 0, issue = 0, finish = 0;
  };
  auto async_run = [&] {
    AsyncRun a;
    a.plain = timed(comm, [&] {
      for (int s = 0; s < steps; ++s) train_step();
    });
    a.with_save = timed(comm, [&] {
      const auto t0 = Clock::now();
      engine.save_async(ckpt);
      a.issue = seconds_since(t0);
      for (int s = 0; s < steps; ++s) train_step();
    });
    a.finish = timed(comm, [&] { engine.wait_for_save(); });
    comm.all_reduce(&a.issue, 1, DType::kFloat64, comm::ReduceOp::kMax)->wait();
    return a;
  };
  const AsyncRun first = async_run(), later = async_run();
  if (rank == 0) {
    const double gb = static_cast<double>(bytes) / 1e9;
    std::printf("checkpoint bench: %.0fM fp32 parameters, stage %d, %d ranks, %.1f MB per rank, %s, median of %d\n",
                millions, stage, world, gb * 1e3, dir.c_str(), rounds);
    // "vs disk": against the faster of the disk's two ways, so the ratio is never flattered.
    const double disk_w = std::min(median(dw), median(dwd)), disk_r = std::min(median(dr), median(drd));
    std::printf("%-30s %10s %12s %14s\n", "per rank", "seconds", "GB/s", "vs disk");
    std::printf("%-30s %10.3f %12.2f %14.2f\n", "disk write + fsync (cached)", median(dw), gb / median(dw),
                disk_w / median(dw));
    std::printf("%-30s %10.3f %12.2f %14.2f\n", "disk write + fsync (O_DIRECT)", median(dwd), gb / median(dwd),
                disk_w / median(dwd));
    std::printf("%-30s %10.3f %12.2f %14.2f\n", "save", median(sv), gb / median(sv), disk_w / median(sv));
    std::printf("%-30s %10.3f %12.2f %14.2f\n", "disk read (cold cache)", median(dr), gb / median(dr),
                disk_r / median(dr));
    std::printf("%-30s %10.3f %12.2f %14.2f\n", "disk read (O_DIRECT)", median(drd), gb / median(drd),
                disk_r / median(drd));
    std::printf("%-30s %10.3f %12.2f %14.2f\n", "load", median(ld), gb / median(ld), disk_r / median(ld));
    for (const auto& [what, a] : {std::pair{"first", first}, std::pair{"later", later}}) {
      std::printf("async save (%s): %d steps %.3f s without a save, %.3f s with one running (its snapshot %.3f s), "
                  "then %.3f s to finish; a synchronous save stops training %.3f s; hidden: %.0f%%\n",
                  what, steps, a.plain, a.with_save, a.issue, a.finish, median(sv),
                  100.0 * (1.0 - std::max(0.0, a.with_save + a.finish - a.plain) / median(sv)));
    }
  }
  comm.barrier()->wait();
  if (rank == 0) std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zero::cli::run_program("checkpoint_bench", run, argc, argv); }
