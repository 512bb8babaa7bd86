"""cc_grpc_proto_library: protos -> C++ messages and gRPC services, with Debian's protoc and plugin.

Bazel 4.2.3's own proto rules would fetch protobuf's sources; this macro runs the installed
/usr/bin/protoc instead, so the generated code always matches the installed libprotobuf.
"""

load("@rules_cc//cc:defs.bzl", "cc_library")

def cc_grpc_proto_library(name, srcs, deps = [], grpc = True, visibility = None):
    """Generates <file>.pb.{h,cc} (and .grpc.pb.{h,cc} when grpc) for each src; one cc_library.

    Args:
      name: the cc_library's name.
      srcs: .proto files of this package; they import each other as "protos/<file>.proto".
      deps: other cc_grpc_proto_library targets whose protos these import.
      grpc: whether to generate service code.
      visibility: the cc_library's visibility.
    """
    bases = [s[:-len(".proto")] for s in srcs]
    hdrs = [b + ".pb.h" for b in bases]
    cc_srcs = [b + ".pb.cc" for b in bases]
    if grpc:
        hdrs += [b + ".grpc.pb.h" for b in bases]
        cc_srcs += [b + ".grpc.pb.cc" for b in bases]
    dep_protos = [d + "_protos" for d in deps]
    native.filegroup(name = name + "_protos", srcs = srcs + dep_protos, visibility = visibility)
    grpc_flags = "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin --grpc_out=$(GENDIR) " if grpc else ""
    native.genrule(
        name = name + "_gen",
        srcs = srcs + dep_protos,
        outs = hdrs + cc_srcs,
        cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR) " + grpc_flags +
              " ".join(["$(location %s)" % s for s in srcs]),
        message = "protoc " + " ".join(srcs),
        visibility = visibility,  # the generated sources, for builds outside Bazel's toolchain (tests/fuzz)
    )
    cc_library(
        name = name,
        srcs = cc_srcs,
        hdrs = hdrs,
        deps = deps + ["@com_google_protobuf//:protobuf"] + (["@com_github_grpc_grpc//:grpc++"] if grpc else []),
        visibility = visibility,
    )
