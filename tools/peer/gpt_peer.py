"""Peer for the GPT benchmarks: PyTorch's own way of training (and serving) the reference GPT of
../shared/targets.md, which stagehand is measured against on the same GPU host.

It mirrors targets.md's measurement: warm-up 3 steps, then the mean of 8 timed steps (between
torch.cuda.synchronize calls; under torchrun after a dist.barrier, and the slowest rank's mean, by an
all-reduce MAX), peak torch.cuda.max_memory_allocated per rank after the timed steps. The model is the
reference pre-LN GPT (no position embedding; qkv/proj/fc1/fc2 with bias; final LayerNorm and a bias-free
H -> V head; loss = mean token cross-entropy in fp32), trained with bf16 autocast over fp32 parameters
and fused AdamW (lr 1e-4, betas (0.9, 0.95), weight decay 0.1, eps 1e-8), on random tokens (one fixed
batch, torch.randint with a fixed seed, reused every step).

Modes:
  eager           1 GPU, one process: GB sequences as --eager-microbatches (4) micro-batches, gradient
                  accumulation (loss / M), one optimizer step per step.
  ddp             torchrun: DistributedDataParallel, GB/world sequences per rank as micro-batches of
                  --ddp-microbatch (8), no_sync for all but the last; with --compile the module is
                  compiled (module.compile()) and then wrapped in DDP.
  pipeline        torchrun: torch.distributed.pipelining, manual split by --split (block counts;
                  embedding with the first stage, head + loss with the last), each stage's nn.Module
                  built directly, --microbatches micro-batches. --schedule gpipe or 1f1b (ScheduleGPipe,
                  Schedule1F1B): one stage per rank. With two stages per rank (2 x world; --split has
                  that many counts): interleaved-1f1b (ScheduleInterleaved1F1B) and zb-interleaved
                  (ScheduleInterleavedZeroBubble), stage v on rank v mod world; zbv (ScheduleZBVZeroBubble),
                  rank r holding stages r and 2 world - 1 - r, so rank 0 has the embedding and the head.
  infer           1 GPU: forward only (eval, no_grad, autocast) over --infer-batch (64) sequences in
                  chunks of --infer-chunk (16).
  infer-pipeline  torchrun: forward-only ScheduleGPipe (no loss_fn) over --infer-batch sequences as
                  --microbatches micro-batches, modules in eval under no_grad.

Run on the GPU host (from the repository root):
  python3 tools/peer/gpt_peer.py --mode=eager
  python3 tools/peer/gpt_peer.py --mode=infer
  torchrun --standalone --nproc_per_node=2 tools/peer/gpt_peer.py --mode=ddp [--compile --warmup=6]
  torchrun --standalone --nproc_per_node=2 tools/peer/gpt_peer.py --mode=pipeline --schedule=1f1b \
      --microbatches=8 --split=12,12
  torchrun --standalone --nproc_per_node=4 tools/peer/gpt_peer.py --mode=pipeline --schedule=zbv \
      --microbatches=8
  torchrun --standalone --nproc_per_node=2 tools/peer/gpt_peer.py --mode=infer-pipeline \
      --microbatches=16 --split=13,11
On a machine without a GPU (tests): add `--device cpu --preset tiny --global-batch 8` (gloo, fp32, no
autocast). Rank 0 prints one line `RESULT {json}` at the end: mode, schedule, microbatches, split, world,
step_s, tokens_per_s, tflops, peak_gib (per rank; null on CPU), loss (last step's; null for inference),
plus the sizes.

load_export(DIR) builds the whole model from a stagehand --export_dir of a GPT (docs/export.md); the
export test (tests/export_test.sh) compares its logits with stagehand's.
"""
import argparse
import json
import math
import os
import sys

# NVLink multicast can take the shared GPUs out of service; keep it off unless the caller says otherwise.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_harness  # noqa: E402

PRESETS = {
    "ref": dict(vocab=32768, hidden=2048, heads=16, layers=24, seq=1024),
    "tiny": dict(vocab=256, hidden=64, heads=4, layers=4, seq=32),
}
DIST_MODES = ("ddp", "pipeline", "infer-pipeline")
# Schedules with two stages per rank, and where they put stage v of 2 W.
MULTI_SCHEDULES = ("interleaved-1f1b", "zb-interleaved", "zbv")


def stages_of_rank(schedule, rank, world):
    """The pipeline stages rank `rank` holds under `schedule` (of `world` ranks), in order."""
    if schedule == "zbv":
        return [rank, 2 * world - 1 - rank]
    if schedule in MULTI_SCHEDULES:
        return [rank, rank + world]
    return [rank]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, choices=("eager", "ddp", "pipeline", "infer", "infer-pipeline"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--preset", default="ref", choices=sorted(PRESETS))
    p.add_argument("--vocab", type=int, help="V (default from --preset)")
    p.add_argument("--hidden", type=int, help="H")
    p.add_argument("--heads", type=int, help="NH")
    p.add_argument("--layers", type=int, help="L (blocks)")
    p.add_argument("--seq", type=int, help="S (sequence length)")
    p.add_argument("--global-batch", type=int, default=32, help="GB sequences per training step")
    p.add_argument("--eager-microbatches", type=int, default=4, help="eager: micro-batches per step (M)")
    p.add_argument("--ddp-microbatch", type=int, default=8, help="ddp: sequences per micro-batch per rank")
    p.add_argument("--schedule", default="gpipe", choices=("gpipe", "1f1b") + MULTI_SCHEDULES,
                   help="pipeline schedule (interleaved-1f1b, zb-interleaved and zbv: two stages per rank)")
    p.add_argument("--microbatches", type=int, default=8, help="pipeline / infer-pipeline micro-batches")
    p.add_argument("--split", default=None,
                   help="pipeline: blocks per stage, comma separated, one per stage: one per rank, or two "
                        "per rank for the two-stage schedules (default: even)")
    p.add_argument("--return-outputs", type=int, default=1, choices=(0, 1),
                   help="pipeline: schedule.step(return_outputs=...); 1 is PyTorch's default")
    p.add_argument("--runtime-shapes", action="store_true",
                   help="pipeline: let PipelineStage infer shapes at run time (needs numpy) instead of "
                        "passing input_args/output_args")
    p.add_argument("--infer-batch", type=int, default=64, help="inference: sequences per step")
    p.add_argument("--infer-chunk", type=int, default=16, help="infer: sequences per forward")
    p.add_argument("--compile", action="store_true",
                   help="eager, infer: torch.compile the model (what a user who wants one-GPU speed runs); "
                        "ddp: compile the module, then wrap it in DDP")
    p.add_argument("--compile-backend", default="inductor",
                   help="with --compile: torch.compile's backend (the tests use aot_eager: the same graphs, "
                        "forward and backward, without Inductor's code generation)")
    p.add_argument("--warmup", type=int, default=None, help="default 3, or 6 with --compile (targets.md)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--print-loss", action="store_true",
                   help="print every step's loss to stderr (syncs each step: for tests, not timing)")
    a = p.parse_args(argv)
    for k, v in PRESETS[a.preset].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.hidden % a.heads:
        p.error(f"--hidden {a.hidden} is not divisible by --heads {a.heads}")
    if a.compile and a.mode not in ("eager", "infer", "ddp"):
        p.error(f"--compile applies to --mode eager, infer and ddp, not {a.mode}")
    if a.warmup is None:
        a.warmup = 6 if a.compile else 3
    if a.steps < 1 or a.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return a


# ----------------------------------------------------------------------------------------------- model

def _init_linear(lin, std, gen):
    nn.init.normal_(lin.weight, mean=0.0, std=std, generator=gen)
    if lin.bias is not None:
        nn.init.zeros_(lin.bias)


def _gen(device, seed, index):
    # One generator per layer (embedding = 0, block i = i + 1, head = L + 1), so a layer gets the same
    # weights whichever stage builds it: the pipelines train the same model as eager and DDP.
    return torch.Generator(device=device).manual_seed(seed * 1000003 + index)


class Block(nn.Module):
    def __init__(self, H, NH, L, gen):
        super().__init__()
        self.nh = NH
        self.ln1 = nn.LayerNorm(H)
        self.qkv = nn.Linear(H, 3 * H)
        self.proj = nn.Linear(H, H)
        self.ln2 = nn.LayerNorm(H)
        self.fc1 = nn.Linear(H, 4 * H)
        self.fc2 = nn.Linear(4 * H, H)
        out_std = 0.02 / math.sqrt(2 * L)
        _init_linear(self.qkv, 0.02, gen)
        _init_linear(self.proj, out_std, gen)
        _init_linear(self.fc1, 0.02, gen)
        _init_linear(self.fc2, out_std, gen)

    def forward(self, x):
        B, S, H = x.shape
        qkv = self.qkv(self.ln1(x)).view(B, S, 3, self.nh, H // self.nh).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, S, H))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPTStage(nn.Module):
    """Blocks [lo, hi) of the GPT; with the embedding if first, with the final LayerNorm and head if last.
    GPTStage(cfg, 0, L, first=True, last=True) is the whole model. Built directly on `device`: only this
    stage's layers exist. With `autocast` the forward runs under bf16 autocast (pipeline stages)."""

    def __init__(self, a, lo, hi, first, last, device, autocast=False):
        super().__init__()
        self.first, self.last, self.autocast = first, last, autocast
        V, H, NH, L = a.vocab, a.hidden, a.heads, a.layers
        with torch.device(device):
            if first:
                self.tok = nn.Embedding(V, H)
                nn.init.normal_(self.tok.weight, mean=0.0, std=0.02, generator=_gen(device, a.seed, 0))
            self.blocks = nn.ModuleList(Block(H, NH, L, _gen(device, a.seed, i + 1)) for i in range(lo, hi))
            if last:
                self.ln_f = nn.LayerNorm(H)
                self.head = nn.Linear(H, V, bias=False)
                _init_linear(self.head, 0.02, _gen(device, a.seed, L + 1))

    def _forward(self, x):
        if self.first:
            x = self.tok(x)
        for b in self.blocks:
            x = b(x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x

    def forward(self, x):
        if self.autocast:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return self._forward(x)
        return self._forward(x)


def _read_safetensors(path):
    """The tensors of a safetensors file (an 8-byte little-endian header length, a JSON header, the raw
    little-endian bytes), read without the safetensors package."""
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
              "I64": torch.int64, "I32": torch.int32}
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=dtypes[e["dtype"]]).reshape(e["shape"]) if raw else \
            torch.empty(e["shape"], dtype=dtypes[e["dtype"]])
    return out


def load_export(directory, device="cpu"):
    """The whole GPT (GPTStage(cfg, 0, L, first=True, last=True)) from a stagehand --export_dir of a GPT
    model (docs/export.md): config.json (model_type "stagehand-gpt"; vocab_size, hidden_size,
    num_attention_heads, num_hidden_layers, max_position_embeddings) and model.safetensors, or
    model-0000r-of-0000n.safetensors with model.safetensors.index.json, holding exactly this module's
    state_dict names (tok.weight, blocks.<i>.{ln1,qkv,proj,ln2,fc1,fc2}.{weight,bias}, ln_f.{weight,bias},
    head.weight) in fp32. Returns (model in eval mode, the sizes as an argparse.Namespace)."""
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "stagehand-gpt":
        raise ValueError(f"{directory}/config.json is of model_type {cfg.get('model_type')!r}, not a stagehand GPT")
    a = argparse.Namespace(vocab=cfg["vocab_size"], hidden=cfg["hidden_size"], heads=cfg["num_attention_heads"],
                           layers=cfg["num_hidden_layers"], seq=cfg["max_position_embeddings"], seed=0)
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state = {}
    for name in files:
        state.update(_read_safetensors(os.path.join(directory, name)))
    model = GPTStage(a, 0, a.layers, True, True, device)
    model.load_state_dict(state, strict=True)  # every tensor, exactly: a missing or extra one raises
    return model.eval(), a


def ce_loss(logits, target):
    """Mean token cross-entropy in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), target.flatten(0, 1))


def make_optimizer(a, params):
    return torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8,
                             fused=True)


def step_flops(a, batch):
    V, H, L, S = a.vocab, a.hidden, a.layers, a.seq
    return 6 * batch * S * (12 * L * H * H + V * H) + 6 * L * batch * S * S * H


# ------------------------------------------------------------------------------------------------ main

def main(argv=None):
    a = parse_args(argv)
    distributed = a.mode in DIST_MODES
    proc = peer_harness.start(a.mode, a.device, distributed)
    cuda, device, local_rank, rank, world = proc.cuda, proc.device, proc.local_rank, proc.rank, proc.world
    use_amp = cuda  # CPU: fp32, no autocast

    def amp():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp)

    def loss_of(module):  # a micro-batch's loss, the forward and the loss under autocast
        def f(x, y):
            with amp():
                return ce_loss(module(x), y)
        return f

    # Data: one fixed batch of random tokens (fixed seed, the same on every rank), reused every step.
    infer = a.mode in ("infer", "infer-pipeline")
    nseq = a.infer_batch if infer else a.global_batch
    g = torch.Generator().manual_seed(a.seed)
    tokens = torch.randint(0, a.vocab, (nseq, a.seq + 1), generator=g).to(device)
    x_all, y_all = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    split = None
    schedule_name = None
    microbatches = None
    last_loss = [None]

    if a.mode == "eager":
        M = a.eager_microbatches
        if a.global_batch % M:
            sys.exit(f"--global-batch {a.global_batch} is not divisible by --eager-microbatches {M}")
        microbatches = M
        model = GPTStage(a, 0, a.layers, True, True, device)
        opt = make_optimizer(a, model.parameters())
        xs, ys = x_all.chunk(M), y_all.chunk(M)
        fwd = torch.compile(model, backend=a.compile_backend) if a.compile else model

        def step():
            last_loss[0] = peer_harness.accumulation_step(loss_of(fwd), xs, ys, opt)

    elif a.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        if a.global_batch % world:
            sys.exit(f"--global-batch {a.global_batch} is not divisible by the world size {world}")
        per_rank = a.global_batch // world
        mb = min(a.ddp_microbatch, per_rank)
        if per_rank % mb:
            sys.exit(f"{per_rank} sequences per rank are not divisible by --ddp-microbatch {mb}")
        n_mb = per_rank // mb
        microbatches = n_mb
        model = GPTStage(a, 0, a.layers, True, True, device)
        if a.compile:
            # Compile the inner module, then wrap it: PyTorch's advice ("Where to apply torch.compile?").
            # Dynamo's DDPOptimizer splits the graph at DDP's bucket boundaries, so the all-reduces still
            # overlap the backward.
            model.compile(backend=a.compile_backend)
        ddp = DDP(model, device_ids=[local_rank] if cuda else None)
        opt = make_optimizer(a, ddp.parameters())
        xs = x_all[rank * per_rank:(rank + 1) * per_rank].chunk(n_mb)
        ys = y_all[rank * per_rank:(rank + 1) * per_rank].chunk(n_mb)

        def step():
            last_loss[0] = peer_harness.accumulation_step(loss_of(ddp), xs, ys, opt, ddp=ddp)

    elif a.mode in ("pipeline", "infer-pipeline"):
        from torch.distributed import pipelining as pp
        multi = a.mode == "pipeline" and a.schedule in MULTI_SCHEDULES
        n_stages = 2 * world if multi else world
        if a.split:
            split = [int(s) for s in a.split.split(",")]
        else:
            split = [a.layers // n_stages + (1 if v < a.layers % n_stages else 0) for v in range(n_stages)]
        if len(split) != n_stages or sum(split) != a.layers or min(split) < 0:
            sys.exit(f"--split {a.split} must have {n_stages} block counts (one per stage"
                     f"{', two per rank' if multi else ''}) summing to {a.layers}")
        if nseq % a.microbatches:
            sys.exit(f"{nseq} sequences are not divisible by --microbatches {a.microbatches}")
        microbatches = a.microbatches
        mine = stages_of_rank(a.schedule if a.mode == "pipeline" else "gpipe", rank, world)
        mb = nseq // a.microbatches
        stages, stage_mods = [], []
        for v in mine:
            lo = sum(split[:v])
            first_v, last_v = v == 0, v == n_stages - 1
            stage_mod = GPTStage(a, lo, lo + split[v], first_v, last_v, device, autocast=use_amp)
            if a.runtime_shapes:
                # PyTorch's runtime shape inference: an extra forward in the first step, and the shapes go
                # from stage to stage by send_object_list (which needs numpy).
                stage = pp.PipelineStage(stage_mod, v, n_stages, device)
            else:
                # The same shapes, given up front (no numpy needed): stage 0 takes token ids [mb, S]; the
                # residual stream between stages is fp32 [mb, S, H] (fp32 embedding plus bf16 branch
                # outputs promote to fp32); the last stage returns logits [mb, S, V], bf16 under autocast.
                # PipelineStage checks the real tensors against these.
                in_meta = (torch.empty(mb, a.seq, dtype=torch.long, device="meta") if first_v else
                           torch.empty(mb, a.seq, a.hidden, dtype=torch.float32, device="meta"))
                out_meta = (torch.empty(mb, a.seq, a.vocab, device="meta",
                                        dtype=torch.bfloat16 if use_amp else torch.float32) if last_v else
                            torch.empty(mb, a.seq, a.hidden, dtype=torch.float32, device="meta"))
                stage = pp.PipelineStage(stage_mod, v, n_stages, device, input_args=in_meta, output_args=out_meta)
            stages.append(stage)
            stage_mods.append(stage_mod)
        first, last = 0 in mine, n_stages - 1 in mine
        # The rank whose stage computes the loss (rank 0 under zbv, the last rank otherwise).
        loss_rank = 0 if multi and a.schedule == "zbv" else world - 1
        ret = bool(a.return_outputs)
        if a.mode == "pipeline":
            schedule_name = a.schedule
            if multi:
                cls = {"interleaved-1f1b": pp.ScheduleInterleaved1F1B,
                       "zb-interleaved": pp.ScheduleInterleavedZeroBubble,
                       "zbv": pp.ScheduleZBVZeroBubble}[a.schedule]
                sched = cls(stages, n_microbatches=a.microbatches, loss_fn=ce_loss)
            else:
                cls = pp.ScheduleGPipe if a.schedule == "gpipe" else pp.Schedule1F1B
                sched = cls(stages[0], n_microbatches=a.microbatches, loss_fn=ce_loss)
            opt = make_optimizer(a, [p for m in stage_mods for p in m.parameters()])

            def step():
                args = (x_all,) if first else ()
                kwargs = dict(target=y_all, losses=[]) if last else {}
                sched.step(*args, return_outputs=ret, **kwargs)
                if last:
                    last_loss[0] = torch.stack(kwargs["losses"]).mean().detach()
                opt.step()
                opt.zero_grad(set_to_none=True)
        else:
            # Forward only: a schedule without loss_fn has no backward, and step() may run under no_grad.
            schedule_name = "gpipe"
            stage_mods[0].eval()
            sched = pp.ScheduleGPipe(stages[0], n_microbatches=a.microbatches, loss_fn=None)

            def step():
                with torch.no_grad():
                    if first:
                        sched.step(x_all, return_outputs=ret)
                    else:
                        sched.step(return_outputs=ret)

    elif a.mode == "infer":
        if a.infer_batch % a.infer_chunk:
            sys.exit(f"--infer-batch {a.infer_batch} is not divisible by --infer-chunk {a.infer_chunk}")
        microbatches = a.infer_batch // a.infer_chunk
        model = GPTStage(a, 0, a.layers, True, True, device).eval()
        xs = x_all.split(a.infer_chunk)
        fwd = torch.compile(model, backend=a.compile_backend) if a.compile else model

        def step():
            with torch.no_grad(), amp():
                for x in xs:
                    fwd(x)

    def show(i):
        if a.print_loss and last_loss[0] is not None:
            print(f"rank {rank} step {i} loss {float(last_loss[0]):.6f}", file=sys.stderr, flush=True)

    step_s, warmup_s = peer_harness.measure(proc, step, a.warmup, a.steps, show)
    peaks = peer_harness.peaks(proc)
    loss_t = torch.tensor([float("nan") if last_loss[0] is None else float(last_loss[0])],
                          dtype=torch.float64, device=device)
    # The loss lives on the last stage (pipeline) or is averaged over ranks (ddp).
    if a.mode == "pipeline":
        dist.broadcast(loss_t, src=loss_rank)
    elif a.mode == "ddp":
        dist.all_reduce(loss_t)
        loss_t /= world
    loss = float(loss_t)
    loss = None if math.isnan(loss) else loss

    if os.environ.get("PEER_KERNEL_TRACE") and not distributed:
        # A developer's kernel trace of one more step, after the figures above were read (bench/trace_summary.py reads it).
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            peer_harness.sync(proc)
        prof.export_chrome_trace(os.environ["PEER_KERNEL_TRACE"])
    if rank == 0:
        from torch._dynamo.utils import counters as dynamo_counters
        flops = step_flops(a, nseq) / (3 if infer else 1)
        result = {
            "mode": a.mode,
            "schedule": schedule_name,
            "microbatches": microbatches,
            "split": split,
            "world": world,
            "step_s": round(step_s, 6),
            "tokens_per_s": round(nseq * a.seq / step_s, 1),
            "tflops": round(flops / step_s / 1e12, 3),
            "peak_gib": [round(p, 3) if p >= 0 else None for p in peaks],
            "loss": loss,
            "compile": bool(a.compile),
            "compile_backend": a.compile_backend if a.compile else None,
            "graphs": dynamo_counters["stats"]["unique_graphs"],  # Dynamo's compiled graphs
            "warmup_s": round(warmup_s, 2),
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": torch.__version__,
            "sizes": {"V": a.vocab, "H": a.hidden, "NH": a.heads, "L": a.layers, "S": a.seq,
                      "batch": nseq, "warmup": a.warmup, "steps": a.steps},
        }
        if a.mode in ("pipeline", "infer-pipeline"):
            result["return_outputs"] = bool(a.return_outputs)
        print("RESULT " + json.dumps(result), flush=True)
    peer_harness.finish(proc)


if __name__ == "__main__":
    main()
