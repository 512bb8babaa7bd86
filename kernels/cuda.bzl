"""cuda_library: one nvcc compile of a .cu file into a cc_library (no LibTorch).

The plain kernels build for Hopper (sm_90, the H200 hosts) and Ampere (sm_80), with PTX for newer GPUs
to compile at load time. `cutlass = True` builds a CUTLASS 3.x kernel instead: sm_90a only (TMA and
wgmma have no portable PTX), with CUTLASS's headers; its callers check that the GPU runs it.
"""

load("@cuda//:defs.bzl", "NVCC")
load("@cutlass//:defs.bzl", "CUTLASS_INCLUDES")
load("@rules_cc//cc:defs.bzl", "cc_library")

_PORTABLE = ("-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 " +
             "-gencode arch=compute_90,code=compute_90")
_CUTLASS = "-DNDEBUG --expt-relaxed-constexpr " + CUTLASS_INCLUDES + " -gencode arch=compute_90a,code=sm_90a"

def cuda_library(name, srcs, hdrs, deps = [], cutlass = False, defines = [], visibility = None, testonly = False, tags = []):
    """A cc_library `name` of the object nvcc makes of the one .cu file in `srcs`.

    Args:
      name: the cc_library's name; the object is NAME.pic.o (genrule NAME_cu).
      srcs: exactly one .cu file, and the .cuh files it includes.
      hdrs: the headers its callers include (the .cu file may include them too).
      deps: more libraries for the cc_library (cudart is always there).
      cutlass: a CUTLASS 3.x kernel (sm_90a only, CUTLASS's headers on the include path).
      defines: -D flags for nvcc only (the cc_library's users do not see them).
      visibility, testonly, tags: as for any rule, on both the genrule and the cc_library.
    """
    cu = [s for s in srcs if s.endswith(".cu")]
    if len(cu) != 1:
        fail("cuda_library %s: srcs has %d .cu files; give exactly one (and its .cuh files)" % (name, len(cu)))
    flags = "-c -O3 -std=c++17 -Xcompiler -fPIC -I. " + (_CUTLASS if cutlass else _PORTABLE)
    flags += "".join([" -D" + d for d in defines])
    native.genrule(
        name = name + "_cu",
        srcs = srcs + hdrs + (["@cutlass//:headers"] if cutlass else []),
        outs = [name + ".pic.o"],
        cmd = NVCC + " " + flags + " $(location " + cu[0] + ") -o $@",
        testonly = testonly,
        tags = tags,
        visibility = ["//visibility:private"],
    )
    cc_library(
        name = name,
        srcs = [":" + name + "_cu"],
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        testonly = testonly,
        tags = tags,
        visibility = visibility,
    )
