"""clang_fuzzer: a libFuzzer binary built with Debian's clang, and a time-bounded fuzzing test per target.

Bazel 4.2.3's toolchain here is gcc, which has no libFuzzer; the fuzzer and the code it exercises are
compiled in one genrule by clang++ with coverage instrumentation and ASan/UBSan, against the same
system libraries (protobuf, abseil) as the rest of the build.
"""

def clang_fuzzer(name, main, compile_srcs, inputs, targets, seconds = 60, seeds = [], dict = None):
    """Defines <name>_bin (the fuzzer) and one test per target, each fuzzing for `seconds`.

    Args:
      name: the fuzzer's name.
      main: the fuzz target's source (defines LLVMFuzzerTestOneInput).
      compile_srcs: workspace paths of the .cc files among `inputs` to compile with it
        ("launcher/coordinator/coordinator.cc"; generated files too, "protos/job.pb.cc").
      inputs: labels of every file the compilation reads (sources, headers, generated protos).
      targets: names passed to the fuzzer as STAGEHAND_FUZZ_TARGET; one test each (name_<target>).
      seconds: fuzzing time per test.
      seeds: files the corpus starts from (valid inputs, so that mutation starts deep in the parser).
      dict: a libFuzzer dictionary (tokens the input format uses).
    """
    pick = " ".join(["%s|*/%s) echo $$f;;" % (s, s) for s in compile_srcs])
    native.genrule(
        name = name + "_bin",
        srcs = [main] + inputs,
        outs = [name],
        cmd = ("srcs=$$(for f in $(SRCS); do case $$f in %s esac; done | sort -u); " % pick) +
              "/usr/bin/clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined " +
              "-fno-sanitize-recover=undefined -Wno-unused-command-line-argument -I. -I$(GENDIR) " +
              "$(location %s) $$srcs -lprotobuf " % main +
              "$$(ls /usr/lib/x86_64-linux-gnu/libabsl_*.so | sed 's|.*/lib\\(.*\\)\\.so$$|-l\\1|') " +
              "-lcrypto -lpthread -ldl -o $@",
        message = "clang++ -fsanitize=fuzzer " + name,
        testonly = True,
    )
    for t in targets:
        native.sh_test(
            name = "%s_%s" % (name, t),
            srcs = ["run_fuzzer.sh"],
            args = ["$(location :%s_bin)" % name, t, str(seconds)] +
                   (["$(location %s)" % dict] if dict else ["-"]) + ["$(location %s)" % f for f in seeds],
            data = [":%s_bin" % name] + seeds + ([dict] if dict else []),
            size = "medium",
            tags = ["fuzz"],
        )
