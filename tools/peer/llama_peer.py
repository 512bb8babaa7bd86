"""Peer for the Llama benchmarks: Hugging Face's LlamaForCausalLM at TinyLlama-1.1B's sizes
(../shared/targets.md), trained and served the way a PyTorch user would, eager or under torch.compile,
on the same GPU host as stagehand's tinyllama-1.1b.

The measurement mirrors tools/peer/gpt_peer.py: warm-up steps (3 eager, 6 compiled), then the mean of
8 timed steps between torch.cuda.synchronize calls (under torchrun after a dist.barrier, and the slowest
rank's mean, by an all-reduce MAX); peak torch.cuda.max_memory_allocated per rank after them.
Training: bf16 autocast over fp32 parameters, fused AdamW (lr 1e-4, betas (0.9, 0.95), weight decay
0.1, eps 1e-8), GB sequences as --microbatches micro-batches with gradient accumulation, loss = mean
token cross-entropy of the logits in fp32 against the next token (as stagehand computes it). Inference:
forward only (eval, no_grad, autocast, no KV cache) over --infer-batch sequences in chunks of
--infer-chunk. Random weights and one fixed batch of random tokens, reused every step.

Modes:
  train   1 GPU: python3 tools/peer/llama_peer.py --mode=train [--compile]
  infer   1 GPU: python3 tools/peer/llama_peer.py --mode=infer [--compile]
  ddp     torchrun --standalone --nproc_per_node=2 tools/peer/llama_peer.py --mode=ddp [--compile]:
          DistributedDataParallel as gpt_peer.py's ddp mode, GB/world sequences per rank as
          micro-batches of --ddp-microbatch (8), no_sync for all but the last, the same optimizer; with
          --compile the module is compiled (module.compile()) and then wrapped in DDP, as PyTorch
          advises, so that Dynamo's DDPOptimizer splits the graph at DDP's buckets.
On a machine without a GPU: add `--device cpu --preset tiny --global-batch 8` (fp32, no autocast; gloo
under torchrun). Rank 0 prints one line `RESULT {json}` at the end: mode, compile, world, microbatches,
step_s, tokens_per_s, peak_gib (per rank; null on CPU), loss (last step's; the mean over ranks under
DDP), warmup_s (the warm-up steps' wall time: compilation included), graphs (Dynamo's compiled graphs),
sizes.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_harness  # noqa: E402

PRESETS = {
    # TinyLlama-1.1B: V 32000, H 2048, 22 blocks, 32 heads, 4 key/value heads, SwiGLU 5632.
    "tinyllama": dict(vocab=32000, hidden=2048, layers=22, heads=32, kv_heads=4, ffn=5632, seq=1024),
    "tiny": dict(vocab=256, hidden=64, layers=4, heads=4, kv_heads=2, ffn=176, seq=32),  # stagehand's llama-tiny
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", required=True, choices=("train", "infer", "ddp"))
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (ddp: compile the module, then wrap it in DDP)")
    p.add_argument("--compile-backend", default="inductor",
                   help="with --compile: torch.compile's backend (the tests use aot_eager: the same graphs, "
                        "forward and backward, without Inductor's code generation)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--preset", default="tinyllama", choices=sorted(PRESETS))
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=4, help="train: micro-batches per step")
    p.add_argument("--ddp-microbatch", type=int, default=8, help="ddp: sequences per micro-batch per rank")
    p.add_argument("--infer-batch", type=int, default=64)
    p.add_argument("--infer-chunk", type=int, default=16)
    p.add_argument("--warmup", type=int, default=None, help="default 3, or 6 with --compile")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--print-loss", action="store_true",
                   help="print every step's loss to stderr (syncs each step: for tests, not timing)")
    a = p.parse_args(argv)
    if a.steps < 1 or (a.warmup is not None and a.warmup < 0):
        p.error("--steps must be >= 1 and --warmup >= 0")
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
    distributed = a.mode == "ddp"
    proc = peer_harness.start(a.mode, a.device, distributed)
    cuda, device, local_rank, rank, world = proc.cuda, proc.device, proc.local_rank, proc.rank, proc.world
    infer = a.mode == "infer"
    nseq = a.infer_batch if infer else a.global_batch
    # Checked before the model is built: a bad batch split costs no time.
    if a.mode == "train" and nseq % a.microbatches:
        sys.exit(f"--global-batch {nseq} is not divisible by --microbatches {a.microbatches}")
    if infer and nseq % a.infer_chunk:
        sys.exit(f"--infer-batch {nseq} is not divisible by --infer-chunk {a.infer_chunk}")
    if distributed:
        if nseq % world:
            sys.exit(f"--global-batch {nseq} is not divisible by the world size {world}")
        per_rank = nseq // world
        mb = min(a.ddp_microbatch, per_rank)
        if per_rank % mb:
            sys.exit(f"{per_rank} sequences per rank are not divisible by --ddp-microbatch {mb}")
    model = build(a, device)  # the same seed on every rank; DDP broadcasts rank 0's weights anyway
    g = torch.Generator().manual_seed(a.seed)
    tokens = torch.randint(0, a.vocab, (nseq, a.seq + 1), generator=g).to(device)
    x_all, y_all = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    last_loss = [None]

    def amp():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    def ce(logits, y):
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))

    def loss_of(module):  # a micro-batch's loss: the forward under autocast, the loss in fp32
        def f(x, y):
            with amp():
                logits = module(input_ids=x).logits
            return ce(logits, y)
        return f

    def optimizer():
        return torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                 fused=cuda)

    if infer:
        fwd = torch.compile(model, backend=a.compile_backend) if a.compile else model
        model.eval()
        xs = x_all.split(a.infer_chunk)
        microbatches = len(xs)

        def step():
            with torch.no_grad(), amp():
                for x in xs:
                    fwd(input_ids=x).logits
    elif a.mode == "train":
        fwd = torch.compile(model, backend=a.compile_backend) if a.compile else model
        M = microbatches = a.microbatches
        opt = optimizer()
        xs, ys = x_all.chunk(M), y_all.chunk(M)

        def step():
            last_loss[0] = peer_harness.accumulation_step(loss_of(fwd), xs, ys, opt)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP
        n_mb = microbatches = per_rank // mb
        if a.compile:
            # Compile the inner module, then wrap it: PyTorch's advice ("Where to apply torch.compile?").
            model.compile(backend=a.compile_backend)
        ddp = DDP(model, device_ids=[local_rank] if cuda else None)
        opt = optimizer()
        xs = x_all[rank * per_rank:(rank + 1) * per_rank].chunk(n_mb)
        ys = y_all[rank * per_rank:(rank + 1) * per_rank].chunk(n_mb)

        def step():
            last_loss[0] = peer_harness.accumulation_step(loss_of(ddp), xs, ys, opt, ddp=ddp)

    def show(i):
        if a.print_loss and last_loss[0] is not None:
            print(f"rank {rank} step {i} loss {float(last_loss[0]):.6f}", file=sys.stderr, flush=True)

    step_s, warmup_s = peer_harness.measure(proc, step, a.warmup, a.steps, show)
    peaks = peer_harness.peaks(proc)
    loss = None if last_loss[0] is None else float(last_loss[0])
    if distributed:
        loss_t = torch.tensor([loss], dtype=torch.float64, device=device)
        dist.all_reduce(loss_t)
        loss = float(loss_t) / world
    if rank == 0:
        from torch._dynamo.utils import counters
        result = {
            "mode": a.mode,
            "compile": bool(a.compile),
            "compile_backend": a.compile_backend if a.compile else None,
            "graphs": counters["stats"]["unique_graphs"],
            "world": world,
            "microbatches": microbatches,
            "step_s": round(step_s, 6),
            "tokens_per_s": round(nseq * a.seq / step_s, 1),
            "peak_gib": [round(p, 3) if p >= 0 else None for p in peaks],
            "loss": loss,
            "warmup_s": round(warmup_s, 2),
            "parameters": sum(p.numel() for p in model.parameters()),
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": torch.__version__,
            "sizes": {"V": a.vocab, "H": a.hidden, "L": a.layers, "NH": a.heads, "KV": a.kv_heads, "F": a.ffn,
                      "S": a.seq, "batch": nseq, "warmup": a.warmup, "steps": a.steps},
        }
        print("RESULT " + json.dumps(result), flush=True)
    peer_harness.finish(proc)


if __name__ == "__main__":
    main()
