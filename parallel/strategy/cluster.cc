#include "parallel/strategy/cluster.h"

#include <cmath>

#include "base/check.h"
#include "base/error.h"
#include "zero/config/json_reading.h"

namespace zero::strategy {
namespace {

using config_internal::Context;
using config_internal::fail;
using config_internal::json;
using config_internal::ObjectReader;
using config_internal::require;

// A positive finite number.
double positive(ObjectReader& r, const std::string& key) {
  const double v = config_internal::read_number(require(r, key), r.path(key), r.ctx());
  if (!std::isfinite(v) || v <= 0) fail(r.ctx(), fmt::format("{} must be positive, got {}", r.path(key), v));
  return v;
}

// A finite number >= 0 (and below `below`, when given).
double non_negative(ObjectReader& r, const std::string& key, double below = INFINITY) {
  const std::string path = r.path(key);
  const double v = config_internal::read_number(require(r, key), path, r.ctx());
  if (!std::isfinite(v) || v < 0) fail(r.ctx(), fmt::format("{} must be >= 0, got {}", path, v));
  if (!(v < below)) fail(r.ctx(), fmt::format("{} must be below {}, got {}", path, below, v));
  return v;
}

Link read_link(ObjectReader& parent, const std::string& key) {
  const json& j = require(parent, key);
  if (!j.is_object()) config_internal::fail_type(j, parent.path(key), parent.ctx(), "an object");
  ObjectReader r(j, parent.path(key), parent.ctx());
  Link l;
  l.bandwidth = positive(r, "bandwidth");
  l.latency = non_negative(r, "latency");
  r.finish();
  return l;
}

SyncWait read_sync(ObjectReader& parent, const json& j) {
  if (!j.is_object()) config_internal::fail_type(j, parent.path("sync"), parent.ctx(), "an object");
  ObjectReader r(j, parent.path("sync"), parent.ctx());
  SyncWait s;
  s.latency = non_negative(r, "latency");
  s.fraction = non_negative(r, "fraction", 1.0);
  r.finish();
  return s;
}

json link_json(const Link& l) { return {{"bandwidth", l.bandwidth}, {"latency", l.latency}}; }

}  // namespace

Cluster parse_cluster(std::string_view text, const std::string& source) {
  const Context ctx{source, "parallel/strategy/cluster.h"};
  const json root = config_internal::parse_json(text, source);
  if (!root.is_object()) fail(ctx, "a cluster description is a JSON object");
  ObjectReader r(root, "", ctx);
  Cluster c;
  c.name = config_internal::read_string(require(r, "name"), "name", ctx, "a string");
  c.devices_per_node = config_internal::read_int(require(r, "devices_per_node"), "devices_per_node", ctx, 1);
  c.nodes = config_internal::read_int(require(r, "nodes"), "nodes", ctx, 1);
  c.device_memory = positive(r, "device_memory");
  c.runtime_reserve = r.find("runtime_reserve") ? non_negative(r, "runtime_reserve", c.device_memory)
                                                 : std::min(kDefaultRuntimeReserve, c.device_memory / 2);
  c.fragmentation = r.find("fragmentation") ? non_negative(r, "fragmentation", 1.0) : kDefaultFragmentation;
  c.peak_flops = positive(r, "peak_flops");
  c.matmul_efficiency = positive(r, "matmul_efficiency");
  if (c.matmul_efficiency > 1) fail(ctx, fmt::format("matmul_efficiency must be in (0, 1], got {}", c.matmul_efficiency));
  c.intra = read_link(r, "intra");
  c.inter = read_link(r, "inter");
  c.optimizer_rate = positive(r, "optimizer_rate");
  if (r.find("host_link") != nullptr) c.host_link = read_link(r, "host_link");
  if (r.find("host_optimizer_rate") != nullptr) c.host_optimizer_rate = positive(r, "host_optimizer_rate");
  if (r.find("copy") != nullptr) c.copy = read_link(r, "copy");
  if (const json* j = r.find("shared_cores")) c.shared_cores = config_internal::read_bool(*j, "shared_cores", ctx);
  if (const json* j = r.find("sync")) c.sync = read_sync(r, *j);
  if (const json* j = r.find("kernels")) {
    if (!j->is_object()) config_internal::fail_type(*j, "kernels", ctx, "an object");
    for (const auto& [key, value] : j->items()) {
      const std::string path = "kernels." + key;
      const double s = config_internal::read_number(value, path, ctx);
      if (!std::isfinite(s) || s <= 0) fail(ctx, fmt::format("{} must be positive, got {}", path, s));
      c.kernels[key] = s;
    }
  }
  r.finish();
  return c;
}

Cluster load_cluster(const std::string& path) {
  return parse_cluster(config_internal::read_text_file(path, "cluster file"), path);
}

std::string to_json(const Cluster& c) {
  json j = {{"name", c.name},
            {"devices_per_node", c.devices_per_node},
            {"nodes", c.nodes},
            {"device_memory", c.device_memory},
            {"runtime_reserve", c.runtime_reserve},
            {"fragmentation", c.fragmentation},
            {"peak_flops", c.peak_flops},
            {"matmul_efficiency", c.matmul_efficiency},
            {"intra", link_json(c.intra)},
            {"inter", link_json(c.inter)},
            {"optimizer_rate", c.optimizer_rate},
            {"shared_cores", c.shared_cores}};
  if (c.host_link) j["host_link"] = link_json(*c.host_link);
  if (c.host_optimizer_rate > 0) j["host_optimizer_rate"] = c.host_optimizer_rate;
  if (c.copy) j["copy"] = link_json(*c.copy);
  if (c.sync.latency > 0 || c.sync.fraction > 0) j["sync"] = {{"latency", c.sync.latency}, {"fraction", c.sync.fraction}};
  if (!c.kernels.empty()) j["kernels"] = c.kernels;
  return j.dump(2) + "\n";
}

}  // namespace zero::strategy
