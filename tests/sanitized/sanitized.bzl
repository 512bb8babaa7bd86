"""sanitized_test: runs a cc_test built, with all of its dependencies, under ASan and UBSan.

A configuration transition adds the sanitizer flags to the test binary and everything it depends on,
so that `bazel test //...` runs the launcher's tests a second time sanitized (gcc's ASan and UBSan;
system libraries are not instrumented).
"""

_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]

def _sanitize(settings, attr):
    return {
        "//command_line_option:copt": settings["//command_line_option:copt"] + _FLAGS,
        "//command_line_option:linkopt": settings["//command_line_option:linkopt"] + _FLAGS,
    }

_sanitize_transition = transition(
    implementation = _sanitize,
    inputs = ["//command_line_option:copt", "//command_line_option:linkopt"],
    outputs = ["//command_line_option:copt", "//command_line_option:linkopt"],
)

def _sanitized_test_impl(ctx):
    test = ctx.attr.test[0]
    binary = test[DefaultInfo].files_to_run.executable
    script = ctx.actions.declare_file(ctx.label.name + ".sh")
    ctx.actions.write(
        output = script,
        content = "#!/usr/bin/env bash\n" +
                  "export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1\n" +
                  "exec \"$TEST_SRCDIR/$TEST_WORKSPACE/%s\" \"$@\"\n" % binary.short_path,
        is_executable = True,
    )
    runfiles = ctx.runfiles(files = [binary]).merge(test[DefaultInfo].default_runfiles)
    return [DefaultInfo(executable = script, runfiles = runfiles)]

sanitized_test = rule(
    implementation = _sanitized_test_impl,
    test = True,
    attrs = {
        "test": attr.label(cfg = _sanitize_transition, executable = True, mandatory = True),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
)
