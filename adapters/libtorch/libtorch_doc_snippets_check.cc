// //adapters/libtorch:libtorch_doc_snippets_test compiles docs/libtorch.md's C++ blocks; compiling is
// the test. This case checks that the blocks were found: the loop before and after.
#include <doctest/doctest.h>

int doc_snippet_count();  // the generated file's

TEST_CASE("docs/libtorch.md's C++ snippets were extracted and compiled") { CHECK(doc_snippet_count() >= 2); }
