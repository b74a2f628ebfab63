# The C++ blocks (```cpp) of the given markdown files as one translation unit, so that a build
# compiles every snippet against the library's public headers (//:doc_snippets_test): the docs
# cannot drift from the API.
#
# -v headers="a.h b.h ..."   included first (the public headers)
#
# A block is the body of an inline function, `run()` in a namespace of its own (compiled, never
# called or emitted). What it uses without declaring (the reader's model, a batch, a step count)
# comes from an HTML comment right before it, which the rendered page does not show; objects there are
# extern declarations (nothing runs at start-up):
#
#   <!-- snippet context
#   extern Engine& engine;
#   int steps = 0;
#   void forward(int unit, const float* w) {}
#   -->
#
# "<!-- snippet namespace -->" puts the block at namespace scope instead (a class, a function). Its
# #include lines are lifted to the top. A fence other than ```cpp (```text) is not compiled.
# Each include once, in the order first met (the generated file is the same on every run).
function add_include(line) {
  if (!(line in includes)) { includes[line] = 1; include_order[++n_includes] = line }
}
BEGIN {
  n = 0
  split(headers, hs, " ")
  for (i = 1; i in hs; i++) add_include("#include \"" hs[i] "\"")
}
FNR == 1 { pending_context = ""; pending_ns = 0 }
in_context {
  if ($0 ~ /-->/) { in_context = 0; next }
  pending_context = pending_context $0 "\n"
  next
}
/^<!-- snippet namespace -->/ { pending_ns = 1; next }
/^<!-- snippet context/ { in_context = 1; pending_context = ""; next }
/^```cpp$/ && !in_block {
  in_block = 1
  n++
  body[n] = ""
  where[n] = FILENAME ":" FNR + 1
  context[n] = pending_context
  ns[n] = pending_ns
  pending_context = ""
  pending_ns = 0
  next
}
/^```/ && in_block { in_block = 0; next }
in_block {
  if ($0 ~ /^#include /) { add_include($0); next }
  body[n] = body[n] $0 "\n"
  next
}
# Any other line between a context comment and its block ends the context's claim.
!/^[[:space:]]*$/ { pending_context = ""; pending_ns = 0 }
END {
  for (i = 1; i <= n_includes; i++) print include_order[i]
  print ""
  for (i = 1; i <= n; i++) {
    print "// " where[i]
    print "namespace doc_snippet_" i " {"
    print "using namespace zero;"
    printf "%s", context[i]
    if (ns[i]) {
      printf "%s", body[i]
    } else {
      print "[[maybe_unused]] inline void run() {"
      printf "%s", body[i]
      print "}"
    }
    print "}  // namespace doc_snippet_" i
    print ""
  }
  print "int doc_snippet_count() { return " n "; }"
}
