#include "layout/layout.h"

#include <doctest/doctest.h>

#include "base/error.h"
#include "layout/layout_json.h"

namespace zero {
namespace {

Layout three_d() {
  Layout l;
  l.dp = 4;
  l.shard = 2;
  l.tp = 2;
  l.pp = 2;
  l.order = {MeshDim::kDp, MeshDim::kPp, MeshDim::kTp};
  l.stage = 3;
  l.offload_optimizer = true;
  l.offload_params = true;
  l.micro_batches = 8;
  l.schedule = "interleaved";
  l.chunks = 2;
  l.sequence_parallel = true;
  l.recompute = true;
  return l;
}

TEST_CASE("the text form reads back every field, and the short names are the long ones") {
  const Layout l = three_d();
  CHECK(parse_layout(layout_text(l)) == l);
  CHECK(layout_text(l) ==
        "dp=4,shard=2,tp=2,pp=2,order=dp,pp,tp,stage=3,offload_optimizer,offload_params,micro_batches=8,"
        "schedule=interleaved,chunks=2,sequence_parallel,recompute");
  CHECK(parse_layout("dp=2,tp=2,sp,m=4,offload,stage=1") ==
        parse_layout("dp=2,tp=2,sequence_parallel=true,micro_batches=4,offload_optimizer,stage=1"));
  CHECK(layout_text(Layout{}) == "dp=1");
  CHECK(parse_layout("dp=1") == Layout{});
  CHECK(parse_layout("order=tp,pp,dp,tp=2").order == MeshOrder{MeshDim::kTp, MeshDim::kPp, MeshDim::kDp});
}

TEST_CASE("parse_layout keeps the base's fields the text does not name") {
  Layout base;
  base.stage = 2;
  base.dp = 8;
  const Layout l = parse_layout("tp=2", base);
  CHECK(l.stage == 2);
  CHECK(l.dp == 8);
  CHECK(l.tp == 2);
}

TEST_CASE("JSON reads back every field; a config's parallel section leaves the engine's out") {
  const Layout l = three_d();
  CHECK(read_layout_json(layout_json(l, LayoutFields::kAll), "layout", LayoutFields::kAll) == l);
  const nlohmann::ordered_json parallel = layout_json(l, LayoutFields::kParallel);
  CHECK_FALSE(parallel.contains("stage"));
  CHECK_FALSE(parallel.contains("micro_batches"));
  CHECK(parallel["order"] == "dp,pp,tp");
  CHECK(parallel["tp"] == 2);
  CHECK(parallel["recompute"] == true);
  // A manifest written before the layout had its other fields (dp, tp, pp, stage and offload only).
  const Layout old = read_layout_json(
      nlohmann::json::parse(R"({"dp": 2, "tp": 1, "pp": 2, "stage": 3, "offload_optimizer": false, "offload_params": false})"),
      "manifest.json: layout", LayoutFields::kAll);
  CHECK(old.dp == 2);
  CHECK(old.pp == 2);
  CHECK(old.stage == 3);
}

void refused(const std::string& text, const std::string& want) {
  CAPTURE(text);
  CHECK_THROWS_WITH_AS(parse_layout(text), doctest::Contains(want.c_str()), InvalidArgument);
}

TEST_CASE("bad text names the item") {
  refused("dp=-1", "layout 'dp=-1': dp=-1 is not an integer in [0,");
  refused("stage=4", "stage=4 is not an integer in [0, 3]");
  refused("tp=x", "tp=x is not an integer");
  refused("schedule=zigzag", "schedule=zigzag is not gpipe, 1f1b, interleaved, zb-h1 or zb-v");
  refused("sp=maybe", "sequence_parallel=maybe is not true or false");
  refused("order=pp,pp,tp", "order: mesh order 'pp,pp,tp': expected pp, dp and tp once each");
  refused("dp=2,,tp=2", "an empty item");
  refused("dq=2", "unknown layout field 'dq' (the fields: dp, shard, tp, pp, order, stage,");
}

TEST_CASE("the rules between fields are refused naming both") {
  refused("stage=2,offload,offload_params", "offload_params needs stage 3 with offload_optimizer (got stage 2)");
  refused("stage=3,offload_params", "optimizer not offloaded");
  refused("dp=6,shard=4,stage=1", "shard=4 does not divide dp=6");
  refused("dp=4,shard=2", "shard=2 needs a sharded stage");
  refused("sp", "sequence_parallel needs tp above 1");
  refused("pp=2,schedule=interleaved", "the interleaved schedule and chunks above 1 go together");
  refused("chunks=2,schedule=interleaved", "chunks=2 needs pp above 1");
}

TEST_CASE("bad JSON names the key and the section") {
  auto read = [](const char* text, LayoutFields which) {
    return read_layout_json(nlohmann::json::parse(text), "cfg.json: parallel", which);
  };
  CHECK_THROWS_WITH_AS(read(R"({"tp": "2"})", LayoutFields::kAll), "cfg.json: parallel.tp must be an integer, got \"2\"",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(read(R"({"recompute": 1})", LayoutFields::kAll),
                       "cfg.json: parallel.recompute must be true or false, got 1", InvalidArgument);
  CHECK_THROWS_WITH_AS(read(R"({"stage": 2})", LayoutFields::kParallel),
                       doctest::Contains("cfg.json: parallel.stage: not a layout field of this section (the engine's options carry it)"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(read(R"({"tpp": 2})", LayoutFields::kParallel),
                       doctest::Contains("cfg.json: parallel.tpp: not a layout field (the fields: dp, shard, tp, pp, order, schedule"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(read(R"({"pp": 0})", LayoutFields::kAll), doctest::Contains("cfg.json: parallel: pp=0 is not an integer in [1,"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(read("[]", LayoutFields::kAll), "cfg.json: parallel must be an object, got []", InvalidArgument);
}

TEST_CASE("dp 0 is the rest of the world") {
  const Layout l = with_world(parse_layout("dp=0,tp=2,pp=2"), 8, "run");
  CHECK(l.dp == 2);
  CHECK(with_world(parse_layout("dp=2,tp=2"), 4, "run").dp == 2);
  CHECK_THROWS_WITH_AS(with_world(parse_layout("dp=0,tp=3"), 8, "run"), "run: tp 3 x pp 1 does not divide the 8 ranks",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(with_world(parse_layout("dp=2,tp=2"), 8, "run"), "run: dp 2 x tp 2 x pp 1 is 4 ranks, but the world has 8 (dp=0: what the world leaves)",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(with_world(parse_layout("dp=0,shard=4,stage=1"), 6, "run"), "run: shard=4 does not divide dp=6",
                       InvalidArgument);
}

TEST_CASE("describe and layout_key") {
  CHECK(describe(three_d()) ==
        "dp 4 x tp 2 x pp 2, stage 3, interleaved x 8, 2 chunks, shard groups of 2, sp, offload (and parameters), "
        "recompute, order dp,pp,tp");
  CHECK(layout_key(three_d()) == "dp4.tp2.pp2.z3.m8.interleaved.v2.hs2.sp.offp.rc.dppptp");
  CHECK(layout_key(Layout{}) == "dp1.tp1.pp1.z0.m1");
}

}  // namespace
}  // namespace zero
