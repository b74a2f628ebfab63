"""Offline stand-in for rules_cc: re-exports Bazel's native C++ rules.

Debian's bazel-rules-cc (0.0.4) loads use_cpp_toolchain, which Bazel 4.2.3 lacks, so it cannot be used.
"""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
cc_proto_library = native.cc_proto_library
objc_library = native.objc_library
