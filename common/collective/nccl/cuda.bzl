"""CUDA toolkit headers and libraries for targets that build only with --config=cuda.

Bazel refuses #includes from absolute paths outside the execution root, so `cuda_headers` copies
the toolkit's include directory (default /usr/local/cuda/include, where nvcc and NCCL live on
these machines) into the output tree and exposes it as a system include directory.
"""

def _cuda_headers_impl(ctx):
    out = ctx.actions.declare_directory(ctx.attr.name)
    ctx.actions.run_shell(
        outputs = [out],
        command = """
src="$1"; dst="$2"
if [ ! -f "$src/cuda_runtime.h" ] || [ ! -f "$src/nccl.h" ]; then
  echo "cuda_headers: no cuda_runtime.h/nccl.h in $src (build without --config=cuda?)" >&2
  exit 1
fi
cp -rL "$src"/. "$dst"/
""",
        arguments = [ctx.attr.path, out.path],
        mnemonic = "CudaHeaders",
        progress_message = "Copying CUDA headers from " + ctx.attr.path,
        execution_requirements = {"local": "1", "no-remote": "1", "no-cache": "1"},
    )
    compilation_context = cc_common.create_compilation_context(
        headers = depset([out]),
        system_includes = depset([out.path]),
    )
    return [
        DefaultInfo(files = depset([out])),
        CcInfo(compilation_context = compilation_context),
    ]

cuda_headers = rule(
    implementation = _cuda_headers_impl,
    attrs = {
        "path": attr.string(default = "/usr/local/cuda/include"),
    },
    doc = "The CUDA toolkit's headers (copied from `path`) as a cc dependency.",
)
