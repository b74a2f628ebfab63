// //:doc_snippets_test compiles every ```cpp block of README.md and docs/ (tools/docs/doc_snippets.awk);
// compiling is the test. This case checks that the blocks were found: the README's loop and the
// getting-started guide's alone are more than ten.
#include <doctest/doctest.h>

int doc_snippet_count();  // the generated file's

TEST_CASE("the docs' C++ snippets were extracted and compiled") { CHECK(doc_snippet_count() >= 15); }
