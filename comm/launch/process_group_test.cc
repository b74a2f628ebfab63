// init_process_group in a single process (no launcher variables: world size 1) and its options.
// The multi-process path runs in comm/gloo/gloo_multiprocess_test.sh (every worker joins through it).
#include "comm/launch/process_group.h"

#include <doctest/doctest.h>

#include <cstdlib>

#include "base/error.h"
#include "comm/nccl/nccl_communicator.h"

namespace zero::comm {
namespace {

void clear_launcher_env() {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "ZERO_COMM_BACKEND"}) {
    unsetenv(v);
  }
}

TEST_CASE("a lone process gets a working host communicator") {
  clear_launcher_env();
  ProcessGroupOptions o;
  o.timeout = std::chrono::seconds(20);
  o.backend = "gloo";
  ProcessGroup pg = init_process_group(o);
  CHECK(pg.env.world_size == 1);
  CHECK(pg.env.rank == 0);
  REQUIRE(pg.host);
  CHECK(pg.host->backend_name() == "gloo");
  CHECK(pg.host->size() == 1);
  CHECK(pg.host->default_timeout() == std::chrono::seconds(20));
  CHECK(pg.device == nullptr);  // "gloo": never a device communicator
  float x[3] = {1, 2, 3};
  pg.host->all_reduce(x, 3, DType::kFloat32, ReduceOp::kAvg)->wait();
  CHECK(x[2] == 3.0f);
}

TEST_CASE("auto picks NCCL only where it is available") {
  clear_launcher_env();
  ProcessGroup pg = init_process_group();
  REQUIRE(pg.host);
  if (nccl_available()) {
    REQUIRE(pg.device);
    CHECK(pg.device->backend_name() == "nccl");
  } else {
    CHECK(pg.device == nullptr);
  }
}

TEST_CASE("bad options and an unavailable backend are reported") {
  clear_launcher_env();
  ProcessGroupOptions o;
  o.backend = "mpi";
  CHECK_THROWS_WITH_AS(init_process_group(o), doctest::Contains("backend"), InvalidArgument);
  o = ProcessGroupOptions{};
  o.timeout = std::chrono::milliseconds(0);
  CHECK_THROWS_WITH_AS(init_process_group(o), doctest::Contains("timeout"), InvalidArgument);
  setenv("ZERO_COMM_BACKEND", "carrier-pigeon", 1);
  CHECK_THROWS_WITH_AS(init_process_group(), doctest::Contains("ZERO_COMM_BACKEND"),
                       InvalidArgument);
  unsetenv("ZERO_COMM_BACKEND");
  if (!nccl_available()) {
    o = ProcessGroupOptions{};
    o.backend = "nccl";
    CHECK_THROWS_WITH_AS(init_process_group(o), doctest::Contains("nccl"), InvalidArgument);
  }
}

}  // namespace
}  // namespace zero::comm
