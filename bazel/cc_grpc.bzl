"""cc_grpc_library on top of native proto_library, using system grpc_cpp_plugin (offline)."""

def _grpc_cc_gen_impl(ctx):
    info = ctx.attr.proto[ProtoInfo]
    outs = []
    args = ctx.actions.args()
    args.add("--plugin=protoc-gen-grpc=" + ctx.executable._plugin.path)
    args.add("--grpc_out=" + ctx.bin_dir.path)
    args.add_joined(info.transitive_descriptor_sets, join_with = ":", format_joined = "--descriptor_set_in=%s")
    for src in info.direct_sources:
        base = src.basename[:-len(".proto")]
        outs += [ctx.actions.declare_file(base + ".grpc.pb.h"), ctx.actions.declare_file(base + ".grpc.pb.cc")]
        args.add(src.short_path)  # import path == workspace-relative path (no strip_import_prefix)
    ctx.actions.run(
        executable = ctx.executable._protoc,
        tools = [ctx.executable._plugin],
        inputs = info.transitive_descriptor_sets,
        outputs = outs,
        arguments = [args],
        mnemonic = "GrpcCppGen",
    )
    return [
        DefaultInfo(files = depset(outs)),
        OutputGroupInfo(hdrs = depset([f for f in outs if f.extension == "h"]),
                        srcs = depset([f for f in outs if f.extension == "cc"])),
    ]

_grpc_cc_gen = rule(
    implementation = _grpc_cc_gen_impl,
    attrs = {
        "proto": attr.label(providers = [ProtoInfo]),
        "_protoc": attr.label(default = "@com_google_protobuf//:protoc", executable = True, cfg = "host"),
        "_plugin": attr.label(default = "//bazel:grpc_cpp_plugin", executable = True, cfg = "host"),
    },
)

def cc_grpc_library(name, proto, cc_proto, visibility = None):
    """gRPC C++ stubs for an existing proto_library `proto` (messages come from `cc_proto`)."""
    _grpc_cc_gen(name = name + "_gen", proto = proto)
    native.filegroup(name = name + "_hdrs", srcs = [":" + name + "_gen"], output_group = "hdrs")
    native.filegroup(name = name + "_srcs", srcs = [":" + name + "_gen"], output_group = "srcs")
    native.cc_library(
        name = name,
        srcs = [":" + name + "_srcs"],
        hdrs = [":" + name + "_hdrs"],
        deps = [cc_proto, "@sys//:grpc++"],
        visibility = visibility,
    )
