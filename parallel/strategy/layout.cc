#include "parallel/strategy/layout.h"

#include <fmt/format.h>

#include <charconv>
#include <sstream>

#include "base/check.h"
#include "base/error.h"

namespace zero::strategy {

std::string describe(const Layout& l) {
  std::string s = fmt::format("dp {} x tp {} x pp {}, stage {}", l.dp, l.tp, l.pp, l.zero_stage);
  if (l.pp > 1) {
    s += fmt::format(", {} x {}", l.schedule, l.micro_batches);
    if (l.chunks > 1) s += fmt::format(", {} chunks", l.chunks);
  } else if (l.micro_batches > 1) {
    s += fmt::format(", {} micro-batches", l.micro_batches);
  }
  if (l.sequence_parallel) s += ", sp";
  if (l.offload) s += ", offload";
  if (l.recompute) s += ", recompute";
  return s;
}

std::string layout_key(const Layout& l) {
  std::string s = fmt::format("dp{}.tp{}.pp{}.z{}.m{}", l.dp, l.tp, l.pp, l.zero_stage, l.micro_batches);
  if (l.pp > 1) s += "." + l.schedule;
  if (l.chunks > 1) s += fmt::format(".v{}", l.chunks);
  if (l.sequence_parallel) s += ".sp";
  if (l.offload) s += ".off";
  if (l.recompute) s += ".rc";
  return s;
}

Layout parse_layout(const std::string& text) {
  Layout l;
  std::istringstream in(text);
  std::string item;
  auto number = [&](const std::string& key, const std::string& value) {
    int v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || v < (key == "stage" ? 0 : 1)) {
      ZERO_THROW(InvalidArgument, "layout '{}': {}={} is not a {} integer", text, key, value,
                 key == "stage" ? "non-negative" : "positive");
    }
    return v;
  };
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "dp") {
      l.dp = number(key, value);
    } else if (key == "tp") {
      l.tp = number(key, value);
    } else if (key == "pp") {
      l.pp = number(key, value);
    } else if (key == "stage") {
      l.zero_stage = number(key, value);
      if (l.zero_stage > 3) ZERO_THROW(InvalidArgument, "layout '{}': stage={} is not 0-3", text, value);
    } else if (key == "m") {
      l.micro_batches = number(key, value);
    } else if (key == "schedule") {
      if (value != "gpipe" && value != "1f1b" && value != "zb-h1" && value != "interleaved") {
        ZERO_THROW(InvalidArgument, "layout '{}': schedule={} is not gpipe, 1f1b, zb-h1 or interleaved", text, value);
      }
      l.schedule = value;
    } else if (key == "chunks") {
      l.chunks = number(key, value);
    } else if (key == "sp" && eq == std::string::npos) {
      l.sequence_parallel = true;
    } else if (key == "offload" && eq == std::string::npos) {
      l.offload = true;
    } else if (key == "recompute" && eq == std::string::npos) {
      l.recompute = true;
    } else {
      ZERO_THROW(InvalidArgument, "layout '{}': unknown item '{}' (dp=, tp=, pp=, stage=, m=, schedule=, chunks=, sp, offload, recompute)",
                 text, item);
    }
  }
  if (l.offload && l.zero_stage == 0) ZERO_THROW(InvalidArgument, "layout '{}': offload needs stage 1-3", text);
  if (l.sequence_parallel && l.tp == 1) ZERO_THROW(InvalidArgument, "layout '{}': sp needs tp above 1", text);
  if ((l.schedule == "interleaved") != (l.chunks > 1)) {
    ZERO_THROW(InvalidArgument, "layout '{}': the interleaved schedule and chunks above 1 go together (schedule={}, chunks={})",
               text, l.schedule, l.chunks);
  }
  if (l.chunks > 1 && l.pp == 1) ZERO_THROW(InvalidArgument, "layout '{}': chunks={} needs pp above 1", text, l.chunks);
  return l;
}

}  // namespace zero::strategy
