"""cuda_library: compiles .cu sources with nvcc, only under --config=cuda.

Bazel 4.2.3 offline has no CUDA rules (rules_cuda cannot be downloaded), so each .cu file becomes a
genrule that runs nvcc, and the objects are wrapped in a cc_library. The genrules are tagged manual and
reached only through a select() on //:cuda_enabled, so the default (CPU) build never needs nvcc or a
CUDA header.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

# Ampere (A100) and Hopper (H100/H200) machine code, plus PTX for newer parts.
CUDA_ARCH_FLAGS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC,-Wall,-Wextra",
    "-DZERO_WITH_CUDA=1",
    "-DSPDLOG_FMT_EXTERNAL",
    "-DSPDLOG_COMPILED_LIB",
]

def cuda_library(name, srcs, hdrs = [], hdr_deps = [], deps = [], nvcc_flags = [], **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc under --config=cuda (empty otherwise).

    Args:
      name: target name.
      srcs: .cu files.
      hdrs: headers exported by the library (also visible to nvcc).
      hdr_deps: filegroups of headers from other packages that the .cu files include.
      deps: cc_library dependencies to link (in addition to cudart).
      nvcc_flags: extra nvcc flags.
      **kwargs: passed to the cc_library.
    """
    objs = []
    for src in srcs:
        obj = "_cuda_obj/%s/%s" % (name, src.replace(".cu", ".o"))
        native.genrule(
            name = "%s_nvcc_%s" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs + hdr_deps,
            outs = [obj],
            cmd = " ".join([NVCC] + NVCC_FLAGS + CUDA_ARCH_FLAGS + nvcc_flags + [
                "-I.",
                "-I$(GENDIR)",
                "-c $(location %s)" % src,
                "-o $@",
            ]),
            tags = ["manual"],
            message = "nvcc %s" % src,
        )
        objs.append(obj)

    native.cc_library(
        name = name,
        srcs = select({
            "//:cuda_enabled": objs,
            "//conditions:default": [],
        }),
        hdrs = hdrs,
        deps = deps + select({
            "//:cuda_enabled": ["@cuda//:cudart"],
            "//conditions:default": [],
        }),
        linkstatic = True,
        **kwargs
    )
