"""Probe: where a gpt-1.3b block's forward time goes on one GPU, part by part, and what the
candidate fusions would save. bf16 autocast semantics by hand (fp32 residual stream, bf16 GEMMs).
Usage on a GPU host: python3 bench/probes/block_parts.py [--mb 4]"""
import argparse, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

p = argparse.ArgumentParser()
p.add_argument("--mb", type=int, nargs="+", default=[4, 16])
a = p.parse_args()
H, NH, S = 2048, 16, 1024
dev = "cuda"
bf = torch.bfloat16


def timeit(fn, n=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        with torch.cuda.graph(g, stream=s):
            for _ in range(10):
                fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n // 10):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / n * 1000  # us


for mb in a.mb:
    T = mb * S
    x = torch.randn(T, H, device=dev)
    g1, b1 = torch.ones(H, device=dev), torch.zeros(H, device=dev)
    wqkv, bqkv = torch.randn(3 * H, H, device=dev, dtype=bf) * 0.02, torch.zeros(3 * H, device=dev, dtype=bf)
    wp, bp = torch.randn(H, H, device=dev, dtype=bf) * 0.02, torch.zeros(H, device=dev, dtype=bf)
    w1, bb1 = torch.randn(4 * H, H, device=dev, dtype=bf) * 0.02, torch.zeros(4 * H, device=dev, dtype=bf)
    w2, bb2 = torch.randn(H, 4 * H, device=dev, dtype=bf) * 0.02, torch.zeros(H, device=dev, dtype=bf)
    xb = x.to(bf)
    qkv = F.linear(xb, wqkv, bqkv).view(mb, S, 3, NH, H // NH).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(T, H)
    y = F.linear(att, wp, bp)
    h = F.gelu(F.linear(xb, w1, bb1))
    def sdpa(backend):
        def fn():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return fn
    ln_cast = torch.compile(lambda t: F.layer_norm(t, (H,), g1, b1).to(bf))
    parts = {
        "layer_norm fp32": lambda: F.layer_norm(x, (H,), g1, b1),
        "cast fp32->bf16": lambda: x.to(bf),
        "layer_norm+cast (compiled, fused)": lambda: ln_cast(x),
        "qkv GEMM (+bias)": lambda: F.linear(xb, wqkv, bqkv),
        "sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "transpose+reshape copy": lambda: att.view(mb, S, NH, H // NH).transpose(1, 2).contiguous(),
        "proj GEMM (+bias)": lambda: F.linear(att, wp, bp),
        "residual add fp32+bf16": lambda: x + y,
        "proj GEMM with fp32 residual as C": lambda: torch.addmm(x, att, wp.t(), out_dtype=torch.float32),
        "fc1 GEMM (+bias)": lambda: F.linear(xb, w1, bb1),
        "gelu erf bf16": lambda: F.gelu(h),
        "fc2 GEMM (+bias)": lambda: F.linear(h, w2, bb2),
    }
    print(f"== micro-batch {mb} sequences ({T} tokens), microseconds per call")
    for name, fn in parts.items():
        try:
            us = timeit(fn)
            print(f"{name:40s} {us:9.1f}")
        except Exception as e:
            print(f"{name:40s} failed: {str(e).splitlines()[0][:100]}")
