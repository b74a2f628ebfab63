# comm/ split into sub-packages, and the shared test helpers moved from tests/ to testing/.
# Converts another branch's BUILD files, sources, scripts and docs to the new labels and paths:
#   git grep -lI -e '//comm:' -e 'comm/' -e '//tests:' -e 'tests/' -- . ':!tools/comm_split_renames.sed' \
#     | xargs sed -E -i -f tools/comm_split_renames.sed
# Idempotent (a converted tree is left unchanged). It handles absolute labels (//comm:x), include
# paths and file paths (comm/x.h, comm/x.cc), and binary paths (bazel-bin/comm/zerorun and the
# runfiles path comm/zerorun). Relative labels inside the old comm/BUILD (":tcp_store") are not
# rewritten: port changes to that file by hand into the new comm/*/BUILD files.
# Unchanged: //comm:communicator, //comm:schedule_check, //comm:schedule_check_test and
# comm/communicator.h, comm/schedule_check.h.

# ---- Bazel labels ----
s#//comm:(store_interface|store_wire_test|store_table|store_wire|store_test|memory_store|prefix_store|tcp_store_test|tcp_store|tcp_socket|store)\b#//comm/store:\1#g
s#//comm:(gloo_store_adapter|gloo_collectives|gloo_communicator_test|gloo_communicator|gloo_multiprocess_|reduce_kernels_test|reduce_kernels)#//comm/gloo:\1#g
s#//comm:(nccl_communicator_test|nccl_communicator)\b#//comm/nccl:\1#g
s#//comm:(dist_env_test|dist_env|process_group_test|process_group|launcher_args_test|launcher|zerorun_test_prog|zerorun_test|zerorun)\b#//comm/launch:\1#g
s#//comm/launch:zerorun_test_prog\b#//comm/test_programs:zerorun_test_prog#g
s#//comm:(comm_bench|store_bench)\b#//comm/benchmarks:\1#g
s#//comm:(collective_checks|gloo_test_worker)\b#//comm/test_programs:\1#g
s#//tests:(doctest_main|testdata|launch)\b#//testing:\1#g
# (not in testing/BUILD's forwarding filegroup, which keeps srcs = ["//tests:pytorch_data"])
/srcs = \[/!s#//tests:pytorch_data\b#//testing:pytorch_data#g

# ---- Source files, headers and scripts (includes, comments, docs) ----
s#(^|[^A-Za-z0-9_.-])comm/(store_table|store_wire_test|store_wire|store_test|store|memory_store|prefix_store|tcp_store_server|tcp_store_socket|tcp_store_test|tcp_store)\.(h|cc)\b#\1comm/store/\2.\3#g
s#(^|[^A-Za-z0-9_.-])comm/(gloo_store_adapter|gloo_collectives|gloo_communicator_test|gloo_communicator|gloo_multiprocess_test|reduce_kernels_test|reduce_kernels)\.(h|cc|sh)\b#\1comm/gloo/\2.\3#g
s#(^|[^A-Za-z0-9_.-])comm/(nccl_communicator_test|nccl_communicator)\.(h|cc)\b#\1comm/nccl/\2.\3#g
s#(^|[^A-Za-z0-9_.-])comm/(dist_env_test|dist_env|process_group_test|process_group|launcher_args_test|launcher|zerorun_main|zerorun_test)\.(h|cc)\b#\1comm/launch/\2.\3#g
s#(^|[^A-Za-z0-9_.-])comm/(comm_bench|store_bench)\.cc\b#\1comm/benchmarks/\2.cc#g
s#(^|[^A-Za-z0-9_.-])comm/(collective_checks|gloo_test_worker|zerorun_test_prog)\.(h|cc)\b#\1comm/test_programs/\2.\3#g
s#(^|[^A-Za-z0-9_.-])tests/(doctest_main\.cc|testdata\.h|launch\.h|launch\.cc)\b#\1testing/\2#g

# ---- Binaries (bazel-bin/comm/x, runfiles paths comm/x) ----
s#(^|[^A-Za-z0-9_.-])comm/zerorun\b#\1comm/launch/zerorun#g
s#(^|[^A-Za-z0-9_.-])comm/(zerorun_test_prog|gloo_test_worker)\b#\1comm/test_programs/\2#g
s#(^|[^A-Za-z0-9_.-])comm/(comm_bench|store_bench)\b#\1comm/benchmarks/\2#g
