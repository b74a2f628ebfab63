// The timeline drawing: one box per compute action with its micro-batch, one row per rank, the
// panels' titles, a closed document.
#include "parallel/pipeline/timeline_svg.h"

#include <doctest/doctest.h>

#include <string>

#include "parallel/pipeline/schedules.h"

namespace zero::parallel {
namespace {

size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

TEST_CASE("every compute action is a box, every rank a row") {
  const SimResult a = simulate(one_f_one_b(4, 8), {});
  const SimResult b = simulate(interleaved_1f1b(4, 8, 2), {});
  const std::string svg = timeline_svg({{"1F1B <p 4>", 1, a.timeline}, {"interleaved", 2, b.timeline}});
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  // 1F1B: F and BW of 8 micro-batches on 4 ranks; interleaved: twice as many (2 chunks).
  CHECK(count(svg, "<title>") == 4 * 8 * 2 + 4 * 8 * 2 * 2);
  CHECK(count(svg, ">rank 3</text>") == 2);
  CHECK(svg.find("1F1B &lt;p 4&gt;") != std::string::npos);  // titles escaped
  CHECK(svg.find("<title>BW7c1 ") != std::string::npos);      // chunk shown where there are several
}

}  // namespace
}  // namespace zero::parallel
