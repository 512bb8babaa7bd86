"""Repository rules for an offline workspace: system libraries from Debian, CUDA, NCCL and LibTorch.

Nothing here downloads. Each rule checks that the files it needs exist and, when one is missing, fails
with the Debian package (or setup step) that provides it.
"""

_SETUP_HINT = "run tools/setup, which installs it"

def _check_files(rctx, files, package):
    for f in files:
        if not rctx.path(f).exists:
            fail("\n\nmissing %s (from %s): %s\n" % (f, package, _SETUP_HINT))

def _system_library_impl(rctx):
    _check_files(rctx, rctx.attr.required_files, rctx.attr.package)
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("BUILD.bazel", rctx.attr.build_file_content)

system_library = repository_rule(
    implementation = _system_library_impl,
    attrs = {
        "required_files": attr.string_list(mandatory = True),
        "package": attr.string(mandatory = True),
        "build_file_content": attr.string(mandatory = True),
    },
    local = True,
    doc = "A library installed under /usr by Debian; headers come from /usr/include (a builtin path).",
)

def _cuda_impl(rctx):
    root = rctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    inc = root + "/include"
    lib = root + "/lib64"
    _check_files(rctx, [inc + "/cuda_runtime_api.h", inc + "/nccl.h", lib + "/libcudart.so", lib + "/libnccl.so"],
                 "the CUDA 13.0 toolkit with NCCL (CUDA_HOME=%s)" % root)
    rctx.symlink(inc, "include")
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    _check_files(rctx, [root + "/bin/nvcc"], "the CUDA 13.0 toolkit's compiler, nvcc (CUDA_HOME=%s)" % root)
    # For genrules that compile our own kernels (worker/BUILD.bazel).
    rctx.file("defs.bzl", 'NVCC = "%s/bin/nvcc"\n' % root)
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cudart",
    hdrs = glob(["include/*.h", "include/crt/*.h", "include/crt/*.hpp", "include/*.hpp"]),
    includes = ["include"],
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcudart"],
)

cc_library(
    name = "nccl",
    deps = [":cudart"],
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lnccl"],
)

# The driver API, loaded at run time (dlopen) so that binaries start on machines without a GPU.
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/*.h", "include/crt/*.h", "include/crt/*.hpp", "include/*.hpp"]),
    includes = ["include"],
)
""".format(lib = lib))

cuda_repository = repository_rule(
    implementation = _cuda_impl,
    environ = ["CUDA_HOME"],
    local = True,
)

_TORCH_VERSION = "2.11.0"

def _find_torch(rctx):
    explicit = rctx.os.environ.get("LIBTORCH_DIR", "")
    if explicit:
        return explicit, True
    workspace_root = rctx.path(Label("//:WORKSPACE")).dirname
    lib_dir = rctx.path("%s/.venv/lib" % workspace_root)
    if lib_dir.exists:
        for py in lib_dir.readdir():
            candidate = rctx.path("%s/site-packages/torch" % py)
            if candidate.exists:
                return str(candidate), False
    fail("\n\nLibTorch not found: no torch in %s/.venv and LIBTORCH_DIR is unset; %s " % (workspace_root, _SETUP_HINT) +
         "(it installs torch==%s into .venv), or set LIBTORCH_DIR to a torch folder holding include/ and lib/.\n" % _TORCH_VERSION)

def _libtorch_impl(rctx):
    torch, explicit = _find_torch(rctx)
    lib = torch + "/lib"
    _check_files(rctx, [torch + "/include/torch/csrc/api/include/torch/torch.h", lib + "/libtorch_cpu.so", lib + "/libc10.so"],
                 "torch==%s (pip)" % _TORCH_VERSION)
    version_py = rctx.path(torch + "/version.py")
    if version_py.exists:
        text = rctx.read(version_py)
        if ("__version__ = '%s" % _TORCH_VERSION) not in text:
            msg = "LibTorch at %s is not torch %s, the version on the GPU hosts" % (torch, _TORCH_VERSION)
            if explicit:
                print("WARNING: " + msg + "; binaries built against it will not run there.")
            else:
                fail("\n\n%s: %s\n" % (msg, _SETUP_HINT))
    # Every header folder but google/: torch ships an old protobuf's headers there, which would shadow
    # the installed protobuf that our generated code needs.
    for entry in rctx.path(torch + "/include").readdir():
        if entry.basename != "google":
            rctx.symlink(entry, "include/" + entry.basename)
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)

    # Libraries are linked by absolute path with an absolute rpath (not copied into Bazel's _solib
    # folder): torch's own RPATH ($ORIGIN/../../nvidia/...) then finds the CUDA libraries of the wheel.
    # Undefined symbols inside torch's libraries are theirs to resolve at load time.
    common = ["-L" + lib, "-Wl,-rpath," + lib, "-Wl,--allow-shlib-undefined"]
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"], allow_empty = True),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = ["_GLIBCXX_USE_CXX11_ABI=1"],
)

# CPU LibTorch: enough for CPU workers and unit tests.
cc_library(
    name = "torch_cpu",
    deps = [":headers"],
    linkopts = {common} + ["-Wl,--no-as-needed", "-ltorch_cpu", "-lc10", "-Wl,--as-needed"],
)

# CUDA LibTorch: --no-as-needed keeps libtorch_cuda.so loaded so that its CUDA kernels register.
cc_library(
    name = "torch_cuda",
    deps = [":headers", "@cuda//:cudart"],
    linkopts = {common} + ["-Wl,--no-as-needed", "-ltorch_cuda", "-lc10_cuda", "-ltorch_cpu", "-lc10",
                           "-Wl,--as-needed"],
)
""".format(common = repr(common)))

libtorch_repository = repository_rule(
    implementation = _libtorch_impl,
    environ = ["LIBTORCH_DIR"],
    local = True,
    doc = "LibTorch from the pinned torch wheel in the project's .venv, or from LIBTORCH_DIR.",
)

_CUTLASS_VERSION = "4.2.0.0"

def _find_cutlass(rctx):
    explicit = rctx.os.environ.get("CUTLASS_DIR", "")
    if explicit:
        return explicit
    workspace_root = rctx.path(Label("//:WORKSPACE")).dirname
    lib_dir = rctx.path("%s/.venv/lib" % workspace_root)
    if lib_dir.exists:
        for py in lib_dir.readdir():
            site = "%s/site-packages" % py
            if rctx.path("%s/cutlass_library/source/include" % site).exists:
                if not rctx.path("%s/nvidia_cutlass-%s.dist-info" % (site, _CUTLASS_VERSION)).exists:
                    fail("\n\n.venv's nvidia-cutlass is not %s: %s\n" % (_CUTLASS_VERSION, _SETUP_HINT))
                return "%s/cutlass_library/source" % site
    fail("\n\nCUTLASS not found: no nvidia-cutlass in %s/.venv and CUTLASS_DIR is unset; %s " % (workspace_root, _SETUP_HINT) +
         "(it installs nvidia-cutlass==%s, headers only, into .venv), or set CUTLASS_DIR to a CUTLASS source tree " % _CUTLASS_VERSION +
         "holding include/ and tools/util/include/.\n")

def _cutlass_impl(rctx):
    source = _find_cutlass(rctx)
    _check_files(rctx, [source + "/include/cutlass/cutlass.h", source + "/include/cute/tensor.hpp",
                        source + "/tools/util/include/cutlass/util/packed_stride.hpp"],
                 "nvidia-cutlass==%s (pip, --no-deps)" % _CUTLASS_VERSION)
    rctx.symlink(source + "/include", "include")
    rctx.symlink(source + "/tools/util/include", "util_include")
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    # For the nvcc genrules (worker/BUILD.bazel): include paths relative to the execution root.
    rctx.file("defs.bzl", 'CUTLASS_INCLUDES = "-Iexternal/{0}/include -Iexternal/{0}/util_include"\n'.format(rctx.name))
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

# CUTLASS 3.x / CuTe headers, header-only: a genrule's srcs, so that nvcc sees them in its sandbox.
filegroup(
    name = "headers",
    srcs = glob(["include/cute/**", "include/cutlass/**", "util_include/cutlass/**"]),
)
""")

cutlass_repository = repository_rule(
    implementation = _cutlass_impl,
    environ = ["CUTLASS_DIR"],
    local = True,
    doc = "CUTLASS's C++ headers from the pinned nvidia-cutlass wheel in the project's .venv, or from CUTLASS_DIR.",
)
