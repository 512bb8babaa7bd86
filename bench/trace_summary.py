"""Where one step's GPU time goes, from a Chrome trace (ours: STAGEHAND_KERNEL_TRACE, worker/pipeline.cc;
the peers: PEER_KERNEL_TRACE, tools/peer/gpt_peer.py): kernels summed by kind and by name, the GPU's busy
time against the span from the first kernel's start to the last one's end.
Usage: python3 bench/trace_summary.py TRACE.json [LABEL] [TOP]"""
import collections
import json
import re
import sys

KINDS = [
    ("attention", r"sdpa|flash|fmha|attention|cudnn|dot_do_o|convert_dq"),
    ("gemm", r"nvjet|gemm|cutlass|xmma|sm90_|cublas|splitk|_tst_|_tss_"),
    ("norm", r"layer_norm|LayerNorm|rms|Norm|GammaBeta"),
    ("loss", r"SoftMax|softmax|nll_loss|CrossEntropy|cross_entropy|LogSumExp"),
    ("optimizer", r"multi_tensor_apply|FusedOptimizer|adam|Adam"),
    ("gelu/act", r"[Gg]elu|silu|SwiGlu|swiglu"),
    ("reduce", r"reduce_kernel|sum_functor"),
    ("copy/cast", r"copy|Copy|bfloat16_copy|CatArray|cast"),
    ("add/mul", r"CUDAFunctor_add|MulFunctor|add_kernel|AddFunctor"),
    ("fill", r"FillFunctor|fill"),
    ("embedding", r"embedding|index|gather|scatter|radix_sort|unique|segment|compute_grad_weight"),
    ("triton", r"^triton_"),
]


def kind_of(name):
    for k, pat in KINDS:
        if re.search(pat, name):
            return k
    return "other"


def main():
    path = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else path
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    data = json.load(open(path))
    events = data["traceEvents"] if isinstance(data, dict) else data
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel")]
    if not kernels:
        print(f"{label}: no kernels in the trace")
        return
    start = min(e["ts"] for e in kernels)
    end = max(e["ts"] + e["dur"] for e in kernels)
    # Busy time: the union of kernel intervals (kernels of several streams may overlap).
    busy, cur_s, cur_e = 0.0, None, None
    for e in sorted(kernels, key=lambda e: e["ts"]):
        s, t = e["ts"], e["ts"] + e["dur"]
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, t
        else:
            cur_e = max(cur_e, t)
    busy += cur_e - cur_s
    total = sum(e["dur"] for e in kernels)
    by_kind = collections.defaultdict(lambda: [0, 0.0])
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        by_kind[kind_of(e["name"])][0] += 1
        by_kind[kind_of(e["name"])][1] += e["dur"]
        by_name[e["name"][:120]][0] += 1
        by_name[e["name"][:120]][1] += e["dur"]
    print(f"## {label}")
    print(f"span {(end - start) / 1e3:.1f} ms (first kernel to last), GPU busy {busy / 1e3:.1f} ms, "
          f"idle {(end - start - busy) / 1e3:.1f} ms, {len(kernels)} kernels, {total / 1e3:.1f} ms summed")
    print("| kind | ms | share | kernels |")
    print("| --- | --- | --- | --- |")
    for k, (n, d) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"| {k} | {d / 1e3:.2f} | {100 * d / total:.1f}% | {n} |")
    print(f"\n| ms | count | mean us | kernel (top {top}) |")
    print("| --- | --- | --- | --- |")
    for name, (n, d) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"| {d / 1e3:.2f} | {n} | {d / n:.1f} | {name} |")
    print()


if __name__ == "__main__":
    main()
