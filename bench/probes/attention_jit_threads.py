# Can a fresh machine's JIT of cuDNN's attention kernels be taken off step 0's path? One process per
# case, each with its own CUDA_CACHE_PATH (set by attention_jit_threads.sh). Cases:
#   serial   the model's order: forward (with logsumexp) then backward, on one thread, cold
#   threads  forward on one thread and backward (called directly, on synthetic out/lse) on another,
#            at once, cold; then the model's forward + backward on the main thread (should hit the cache)
#   b1       as threads but with batch 1; then the batch-8 model pass (does the kernel depend on B?)
#   infer    forward without logsumexp (no grad) on a thread; then the no-grad forward on main
# Prints one line per case: times in ms and the JIT cache's file count before/after the check pass.
import os, sys, threading, time
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

case, family = sys.argv[1], sys.argv[2]
cache = os.environ["CUDA_CACHE_PATH"]
def files():
    return sum(len(f) for _, _, f in os.walk(cache))
dev = torch.device("cuda")
torch.cuda.init(); torch.empty(1, device=dev)

if family == "gpt":
    NH, KV, D, S = 16, 16, 128, 1024
else:
    NH, KV, D, S = 32, 4, 64, 2048
B = 8 if case != "infer" else 16

def model_qkv(b, grad):
    if family == "gpt":  # views of [B, S, 3, NH, D], as the GPT's qkv projection splits them
        x = torch.randn(b, S, 3, NH, D, device=dev, dtype=torch.bfloat16)
        x.requires_grad_(grad)
        q, k, v = x.permute(2, 0, 3, 1, 4).unbind(0)
        return x, q, k, v
    q = torch.randn(b, S, NH, D, device=dev, dtype=torch.bfloat16).requires_grad_(grad)
    k = torch.randn(b, S, KV, D, device=dev, dtype=torch.bfloat16).requires_grad_(grad)
    v = torch.randn(b, S, KV, D, device=dev, dtype=torch.bfloat16).requires_grad_(grad)
    return (q, k, v), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

def model_pass(b, grad):
    leaf, q, k, v = model_qkv(b, grad)
    torch.cuda.synchronize(); t0 = time.perf_counter()
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.set_grad_enabled(grad):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=(NH != KV))
    torch.cuda.synchronize(); t1 = time.perf_counter()
    if grad:
        o.transpose(1, 2).reshape(b, S, NH * D).backward(torch.randn(b, S, NH * D, device=dev, dtype=torch.bfloat16))
    torch.cuda.synchronize(); t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, o

def kv_for_op(k, v):  # the op takes as many k/v heads as q has? try as is first
    return k, v

results = {}
def fwd(b, lse):
    _, q, k, v = model_qkv(b, False)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t0 = time.perf_counter()
        r = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, lse, 0.0, True, False)
        s.synchronize()
        results["fwd"] = (time.perf_counter() - t0) * 1e3
        results["fwd_meta"] = [(tuple(t.shape), tuple(t.stride()), str(t.dtype)) if isinstance(t, torch.Tensor) else t for t in r]

def bwd(b):
    _, q, k, v = model_qkv(b, False)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        # out: q's layout ([B, S, NH, D] memory, viewed [B, NH, S, D]); lse [B, NH, S, 1] fp32
        out = torch.empty(b, S, NH, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
        lse = torch.zeros(b, NH, S, 1, device=dev, dtype=torch.float32)
        go = torch.randn(b, S, NH, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
        seed = torch.zeros((), dtype=torch.int64, device=dev); off = torch.zeros((), dtype=torch.int64, device=dev)
        t0 = time.perf_counter()
        errs = []
        for none in (None, torch.empty(0, device=dev), torch.empty(0, 0, 0, 0, device=dev)):
            try:
                torch.ops.aten._scaled_dot_product_cudnn_attention_backward(go, q, k, v, out, lse, seed, off, none, none, none, S, S, 0.0, True)
                s.synchronize()
                results["bwd"] = (time.perf_counter() - t0) * 1e3
                return
            except Exception as e:
                errs.append(str(e)[:200])
        results["bwd"] = "failed: " + " / ".join(errs)

before = files()
t0 = time.perf_counter()
if case == "serial":
    f, b, _ = model_pass(B, True)
    results.update(fwd=f, bwd=b)
else:
    wb = 1 if case == "b1" else B
    ths = [threading.Thread(target=fwd, args=(wb, case != "infer"))]
    if case != "infer":
        ths.append(threading.Thread(target=bwd, args=(wb,)))
    for t in ths: t.start()
    for t in ths: t.join()
wall = (time.perf_counter() - t0) * 1e3
mid = files()
f2, b2, o = model_pass(B, case != "infer")
f3, b3, _ = model_pass(B, case != "infer")
after = files()
print(f"| {family} | {case} | {wall:.0f} | {results.get('fwd', '')} | {results.get('bwd', '')} | {f2:.0f} / {b2:.0f} | {f3:.0f} / {b3:.0f} | {before} / {mid} / {after} |", flush=True)
print(f"  fwd outputs: {results.get('fwd_meta')}", file=sys.stderr)
print(f"  model out: {tuple(o.shape)} {tuple(o.stride())}", file=sys.stderr)
