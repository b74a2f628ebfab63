"""What the LibTorch targets (adapters/libtorch, examples/libtorch) add to their rules."""

# target_compatible_with of a target that needs LibTorch: buildable only under --config=libtorch.
LIBTORCH_ONLY = select({
    "//adapters/libtorch:libtorch_enabled": [],
    "//conditions:default": ["//adapters/libtorch:libtorch_missing"],
})

def libtorch_deps():
    """@libtorch under --config=libtorch, nothing otherwise (so the default build never loads it)."""
    return select({
        "//adapters/libtorch:libtorch_enabled": ["@libtorch"],
        "//conditions:default": [],
    })
