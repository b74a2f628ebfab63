"""The Debian packages the library builds on, as Bazel repositories: called by this WORKSPACE and by a
workspace that depends on this one as @zero (docs/install.md, examples/external/bazel)."""

def _system_library(name, path, build_file):
    # Label() resolves against this file's repository: //third_party here, @zero//third_party there.
    native.new_local_repository(name = name, path = path, build_file = str(Label(build_file)))

def zero_dependencies():
    """Declares @gloo, @eigen, @boost, @fmt, @spdlog, @doctest, @nlohmann_json, @cuda and @libtorch."""
    _system_library("gloo", "/usr", "//third_party:gloo.BUILD")
    _system_library("eigen", "/usr/include/eigen3", "//third_party:eigen.BUILD")
    _system_library("boost", "/usr/include", "//third_party:boost.BUILD")
    _system_library("fmt", "/usr", "//third_party:fmt.BUILD")
    _system_library("spdlog", "/usr", "//third_party:spdlog.BUILD")
    _system_library("doctest", "/usr/include/doctest", "//third_party:doctest.BUILD")
    _system_library("nlohmann_json", "/usr/include/nlohmann", "//third_party:nlohmann_json.BUILD")

    # CUDA toolkit and NCCL; only used under --config=cuda (see tools/cuda/).
    _system_library("cuda", "/usr/local/cuda", "//third_party:cuda.BUILD")

    # LibTorch (Debian's libtorch-dev 1.13.1, CPU); only used under --config=libtorch
    # (adapters/libtorch, examples/libtorch). The path must exist for the repository to load, which
    # Debian's /usr/include/torch/csrc/api does only with libtorch-dev installed: nothing outside
    # those packages refers to @libtorch, so `bazel build //...` never loads it.
    _system_library("libtorch", "/usr/include/torch/csrc/api", "//third_party:libtorch.BUILD")
