#include "parallel/strategy/cluster.h"

#include <doctest/doctest.h>

#include <string>

#include "base/error.h"

namespace zero::strategy {
namespace {

const char* kGood = R"({
  "name": "2 x test", "devices_per_node": 2, "nodes": 1, "device_memory": 1e9, "peak_flops": 1e11,
  "matmul_efficiency": 0.5, "intra": {"bandwidth": 1e9, "latency": 1e-5},
  "inter": {"bandwidth": 1e8, "latency": 1e-4}, "optimizer_rate": 1e8, "shared_cores": true,
  "host_link": {"bandwidth": 2e9, "latency": 0}, "host_optimizer_rate": 5e7,
  "copy": {"bandwidth": 4e9, "latency": 1e-6},
  "sync": {"latency": 2e-4, "fraction": 0.125},
  "kernels": {"gpt/f/x": 0.25}
})";

std::string error_of(const std::string& text) {
  try {
    parse_cluster(text, "c.json");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

// kGood with `from` replaced by `to`.
std::string with(const std::string& from, const std::string& to) {
  std::string s = kGood;
  const size_t at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

TEST_CASE("a cluster file reads back from its own JSON") {
  const Cluster c = parse_cluster(kGood, "c.json");
  CHECK(c.devices() == 2);
  CHECK(c.intra.time(1e9) == doctest::Approx(1.0 + 1e-5));
  CHECK(c.shared_cores);
  CHECK(c.kernels.at("gpt/f/x") == 0.25);
  REQUIRE(c.host_link);
  CHECK(c.host_link->bandwidth == 2e9);
  CHECK(c.host_optimizer_rate == 5e7);
  REQUIRE(c.copy);
  CHECK(c.copy->time(4e9) == doctest::Approx(1.0 + 1e-6));
  CHECK(c.sync.latency == 2e-4);
  CHECK(c.sync.fraction == 0.125);
  CHECK(c.sync.time(3, 0.5) == doctest::Approx(3 * 2e-4 + 0.0625));
  CHECK(c.sync.time(0, 0.5) == 0);  // nothing synchronizes: no wait
  const Cluster back = parse_cluster(to_json(c), "again.json");
  CHECK(to_json(back) == to_json(c));
}

TEST_CASE("device_memory is physical: a file's runtime reserve and fragmentation margin, defaulted, come off it") {
  // kGood says neither: 2 GiB for the runtime (at most half the device), then 5% of the rest.
  const Cluster d = parse_cluster(kGood, "c.json");
  CHECK(d.runtime_reserve == 0.5e9);
  CHECK(d.fragmentation == kDefaultFragmentation);
  CHECK(d.usable_memory() == doctest::Approx(0.5e9 * 0.95));
  const Cluster big = parse_cluster(with(R"("device_memory": 1e9)", R"("device_memory": 85899345920)"), "c.json");
  CHECK(big.runtime_reserve == kDefaultRuntimeReserve);
  CHECK(big.usable_memory() == doctest::Approx((80.0 - 2.0) * (1 << 30) * 0.95));
  const Cluster own =
      parse_cluster(with(R"("device_memory": 1e9)", R"("device_memory": 1e9, "runtime_reserve": 1e8, "fragmentation": 0.1)"),
                    "c.json");
  CHECK(own.usable_memory() == doctest::Approx(0.9e9 * 0.9));
  CHECK(parse_cluster(to_json(own), "again.json").usable_memory() == own.usable_memory());
  CHECK(Cluster{}.runtime_reserve == 0);  // built in code: what it says
  CHECK(error_of(with(R"("device_memory": 1e9)", R"("device_memory": 1e9, "runtime_reserve": 2e9)"))
            .find("runtime_reserve must be below 1000000000") != std::string::npos);
  CHECK(error_of(with(R"("device_memory": 1e9)", R"("device_memory": 1e9, "fragmentation": 1)"))
            .find("fragmentation must be below 1") != std::string::npos);
  CHECK(error_of(with(R"("device_memory": 1e9)", R"("device_memory": 1e9, "fragmentation": -0.1)"))
            .find("fragmentation must be >= 0") != std::string::npos);
}

TEST_CASE("a missing, negative, out-of-range, mistyped or unknown field is named") {
  CHECK(error_of(with(R"("optimizer_rate": 1e8, )", "")).find("c.json: missing field optimizer_rate") !=
        std::string::npos);
  CHECK(error_of(with(R"("bandwidth": 1e8)", R"("bandwidth": -3)")).find("inter.bandwidth must be positive, got -3") !=
        std::string::npos);
  CHECK(error_of(with(R"("latency": 1e-5)", R"("latency": -1)")).find("intra.latency must be >= 0") != std::string::npos);
  CHECK(error_of(with("0.5", "1.5")).find("matmul_efficiency must be in (0, 1], got 1.5") != std::string::npos);
  CHECK(error_of(with(R"("nodes": 1)", R"("nodes": 0)")).find("nodes") != std::string::npos);
  CHECK(error_of(with(R"("devices_per_node": 2)", R"("devices_per_node": "2")")).find("devices_per_node") !=
        std::string::npos);
  // A misspelt field is missing; a key nobody reads is refused with the nearest known one.
  CHECK(error_of(with(R"("peak_flops")", R"("peak_flop")")).find("missing field peak_flops") != std::string::npos);
  CHECK(error_of(with(R"("nodes": 1)", R"("nodes": 1, "node": 2)")).find("unknown key node (did you mean nodes?)") !=
        std::string::npos);
  // The synchronization wait: both fields, each >= 0, the fraction below 1.
  CHECK(error_of(with(R"("fraction": 0.125)", R"("fraction": 1.5)")).find("sync.fraction must be below 1, got 1.5") !=
        std::string::npos);
  CHECK(error_of(with(R"("latency": 2e-4)", R"("latency": -2e-4)")).find("sync.latency must be >= 0") !=
        std::string::npos);
  CHECK(error_of(with(R"(, "fraction": 0.125)", "")).find("missing field sync.fraction") != std::string::npos);
  CHECK(Cluster{}.sync.time(5, 1.0) == 0);  // absent: no wait
  CHECK(error_of(with("4e9", "0")).find("copy.bandwidth must be positive, got 0") != std::string::npos);
  CHECK(!Cluster{}.copy);  // absent: copies are free
  CHECK(error_of(with("0.25", "0")).find("kernels.gpt/f/x must be positive") != std::string::npos);
  CHECK(error_of("[1]").find("a cluster description is a JSON object") != std::string::npos);
  CHECK_THROWS_AS(load_cluster("/nonexistent/cluster.json"), IoError);
}

}  // namespace
}  // namespace zero::strategy
