"""What the peers (gpt_peer.py, llama_peer.py) share: the process (one, or a rank under torchrun, with
its device and process group) and the measurement (warm-up steps, then the mean of timed steps between
synchronisations; under torchrun after a barrier and the slowest rank's mean; peak memory per rank).
Written once so that every peer measures the same way."""
import contextlib
import os
import sys
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist


def start(mode, device_name, distributed):
    """The process of a peer's --mode: its device (cuda:LOCAL_RANK or cpu), rank and world size, and under
    torchrun (distributed) the process group (NCCL on GPUs, gloo on CPUs). One line and exit 2 where the
    mode and the launch do not match."""
    if not distributed and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.exit(f"--mode={mode} is single-process; run it with python3, not torchrun")
    if distributed and "RANK" not in os.environ:
        sys.exit(f"--mode={mode} needs torchrun (e.g. torchrun --standalone --nproc_per_node=2 ...)")
    cuda = device_name == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device; use --device cpu")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    rank, world = 0, 1
    if distributed:
        if cuda:
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    return SimpleNamespace(cuda=cuda, device=device, local_rank=local_rank, rank=rank, world=world,
                           distributed=distributed)


def accumulation_step(loss_of, xs, ys, opt, ddp=None):
    """One optimizer step of gradient accumulation over the micro-batches (xs, ys): loss_of(x, y) (its
    own autocast), then the backward of loss / M. With `ddp` (DistributedDataParallel) the gradients are
    all-reduced once, in the last micro-batch's backward (no_sync for the others). Returns the mean loss
    (a tensor, not synchronised)."""
    m = len(xs)
    total = 0.0
    for i, (x, y) in enumerate(zip(xs, ys)):
        with ddp.no_sync() if ddp is not None and i < m - 1 else contextlib.nullcontext():
            loss = loss_of(x, y)
            (loss / m).backward()
        total = total + loss.detach()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total / m


def sync(p):
    if p.cuda:
        torch.cuda.synchronize()


def measure(p, step, warmup, steps, show=lambda i: None):
    """Runs `warmup` steps, then `steps` timed ones; returns (mean step seconds, warm-up seconds). Under
    torchrun the timed steps start after a barrier and the mean is the slowest rank's."""
    t_start = time.perf_counter()
    for i in range(warmup):
        step()
        show(i)
    sync(p)
    warmup_s = time.perf_counter() - t_start
    if p.distributed:
        dist.barrier()
    sync(p)
    t0 = time.perf_counter()
    for i in range(steps):
        step()
        show(warmup + i)
    sync(p)
    step_s = (time.perf_counter() - t0) / steps
    if p.distributed:
        t = torch.tensor([step_s], dtype=torch.float64, device=p.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        step_s = float(t)
    return step_s, warmup_s


def peaks(p):
    """torch.cuda.max_memory_allocated of every rank in GiB (-1.0 on CPU), in rank order."""
    peak = torch.cuda.max_memory_allocated(p.device) / 2**30 if p.cuda else -1.0
    if not p.distributed:
        return [peak]
    out = [torch.zeros(1, dtype=torch.float64, device=p.device) for _ in range(p.world)]
    dist.all_gather(out, torch.tensor([peak], dtype=torch.float64, device=p.device))
    return [float(x) for x in out]


def finish(p):
    """Ends a peer's process. Under torchrun: a barrier (every rank is done), the process group destroyed,
    the output flushed, then os._exit(0), not the interpreter's own finalization. The reason is gloo's
    worker thread: it drops the last collective's work object (which holds tensors Python has seen, e.g.
    DDP's gradient buckets) only after the collective is reported done, and dropping those tensors takes
    the GIL. If the main thread is already finalizing the interpreter by then, taking the GIL ends that
    thread with pthread_exit, whose unwinding through a noexcept destructor calls std::terminate: the
    rank dies with SIGABRT ("terminate called without an active exception") after its work is done. A
    loaded machine makes that window wide (seen in tests/peer_ddp_test.sh under `bazel test //...`)."""
    if not p.distributed:
        return
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
