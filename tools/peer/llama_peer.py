"""Peer for the Llama benchmarks: Hugging Face's LlamaForCausalLM at TinyLlama-1.1B's sizes
(../shared/targets.md), trained and served the way a PyTorch user would, eager or under torch.compile,
on the same GPU host as stagehand's tinyllama-1.1b.

The measurement mirrors tools/peer/gpt_peer.py: warm-up steps (3 eager, 6 compiled), then the mean of
8 timed steps between torch.cuda.synchronize calls; peak torch.cuda.max_memory_allocated after them.
Training: bf16 autocast over fp32 parameters, fused AdamW (lr 1e-4, betas (0.9, 0.95), weight decay
0.1, eps 1e-8), GB sequences as --microbatches micro-batches with gradient accumulation, loss = mean
token cross-entropy of the logits in fp32 against the next token (as stagehand computes it). Inference:
forward only (eval, no_grad, autocast, no KV cache) over --infer-batch sequences in chunks of
--infer-chunk. Random weights and one fixed batch of random tokens, reused every step.

Modes:
  train   python3 tools/peer/llama_peer.py --mode=train [--compile]
  infer   python3 tools/peer/llama_peer.py --mode=infer [--compile]
On a machine without a GPU: add `--device cpu --preset tiny --global-batch 8` (fp32, no autocast).
Prints one line `RESULT {json}` at the end: mode, compile, step_s, tokens_per_s, peak_gib, loss,
warmup_s (the warm-up steps' wall time: compilation included), sizes.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

PRESETS = {
    # TinyLlama-1.1B: V 32000, H 2048, 22 blocks, 32 heads, 4 key/value heads, SwiGLU 5632.
    "tinyllama": dict(vocab=32000, hidden=2048, layers=22, heads=32, kv_heads=4, ffn=5632, seq=1024),
    "tiny": dict(vocab=256, hidden=64, layers=4, heads=4, kv_heads=2, ffn=176, seq=32),  # stagehand's llama-tiny
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", required=True, choices=("train", "infer"))
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--preset", default="tinyllama", choices=sorted(PRESETS))
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--infer-batch", type=int, default=64)
    p.add_argument("--infer-chunk", type=int, default=16)
    p.add_argument("--warmup", type=int, default=None, help="default 3, or 6 with --compile")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    if a.warmup is None:
        a.warmup = 6 if a.compile else 3
    for k, v in PRESETS[a.preset].items():
        setattr(a, k, v)
    return a


def build(a, device):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, max_position_embeddings=max(2048, a.seq),
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                         attention_bias=False, mlp_bias=False, use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(a.seed)
    return LlamaForCausalLM(config).to(device)


def main(argv=None):
    a = parse_args(argv)
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("no CUDA device; use --device cpu")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    model = build(a, device)
    fwd = torch.compile(model) if a.compile else model
    infer = a.mode == "infer"
    nseq = a.infer_batch if infer else a.global_batch
    g = torch.Generator().manual_seed(a.seed)
    tokens = torch.randint(0, a.vocab, (nseq, a.seq + 1), generator=g).to(device)
    x_all, y_all = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    last_loss = [None]

    def amp():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    if infer:
        model.eval()
        xs = x_all.split(a.infer_chunk)

        def step():
            with torch.no_grad(), amp():
                for x in xs:
                    fwd(input_ids=x).logits
    else:
        M = a.microbatches
        if nseq % M:
            sys.exit(f"--global-batch {nseq} is not divisible by --microbatches {M}")
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                fused=cuda)
        xs, ys = x_all.chunk(M), y_all.chunk(M)

        def step():
            total = 0.0
            for x, y in zip(xs, ys):
                with amp():
                    logits = fwd(input_ids=x).logits
                loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
                (loss / M).backward()
                total = total + loss.detach()
            opt.step()
            opt.zero_grad(set_to_none=True)
            last_loss[0] = total / M

    def sync():
        if cuda:
            torch.cuda.synchronize()

    t_start = time.perf_counter()
    for _ in range(a.warmup):
        step()
    sync()
    warmup_s = time.perf_counter() - t_start
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    sync()
    step_s = (time.perf_counter() - t0) / a.steps
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    result = {
        "mode": a.mode,
        "compile": bool(a.compile),
        "step_s": round(step_s, 6),
        "tokens_per_s": round(nseq * a.seq / step_s, 1),
        "peak_gib": [round(peak, 3) if peak is not None else None],
        "loss": None if last_loss[0] is None else float(last_loss[0]),
        "warmup_s": round(warmup_s, 2),
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "sizes": {"V": a.vocab, "H": a.hidden, "L": a.layers, "NH": a.heads, "KV": a.kv_heads, "F": a.ffn,
                  "S": a.seq, "batch": nseq, "warmup": a.warmup, "steps": a.steps},
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
