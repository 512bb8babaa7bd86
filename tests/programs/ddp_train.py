"""A small torch.distributed DDP training script in torchrun's style, for tests/program_test.sh,
tests/program_sweep_test.sh and tests/program_nodes_test.sh.

Every rank takes its shard of each global batch; DDP averages the gradients, so the run equals one
process over the whole batch. Rank 0 prints one "step N loss X" line per step (the global batch's
mean loss, all-reduced) and writes them to --out; --report reports each step to the launcher
(stagehand.step: the loss, the global batch's tokens, samples and FLOPs). --fail_rank R
--fail_step S raises on rank R at step S; --hang_rank R sleeps there instead.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--global_batch", type=int, default=16)
    p.add_argument("--out", default="")
    p.add_argument("--fail_rank", type=int, default=-1)
    p.add_argument("--fail_step", type=int, default=-1)
    p.add_argument("--fail_once", action="store_true")
    p.add_argument("--snapshot", default="")
    p.add_argument("--report", action="store_true")
    p.add_argument("--hang_rank", type=int, default=-1)
    p.add_argument("--hang_step", type=int, default=-1)
    args = p.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    # Node-major ranks, the same workers on every node (one host: LOCAL_RANK is RANK).
    assert int(os.environ["LOCAL_RANK"]) == rank - int(os.environ["GROUP_RANK"]) * int(os.environ["LOCAL_WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).double())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    per_rank = args.global_batch // world
    losses = []
    first = 0
    if args.snapshot and os.path.exists(args.snapshot):
        snap = torch.load(args.snapshot, weights_only=False)
        model.module.load_state_dict(snap["model"])
        opt.load_state_dict(snap["opt"])
        data.set_state(snap["data"])
        losses, first = snap["losses"], snap["step"]
        if rank == 0:
            print(f"attempt {attempt}: resuming at step {first}", flush=True)
    for step in range(first, args.steps):
        x = torch.randn(args.global_batch, 8, generator=data, dtype=torch.float64)
        y = x.sum(dim=1, keepdim=True).sin()
        xs, ys = x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]
        if rank == args.hang_rank and step == args.hang_step:
            time.sleep(3600)
        if rank == args.fail_rank and step == args.fail_step and not (args.fail_once and attempt > 0):
            raise ValueError(f"bad batch at step {step} on rank {rank}")
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.17g}", flush=True)
        if args.report:
            import stagehand  # on PYTHONPATH under the launcher
            # The global batch's: 8 inputs a sample, and 6 FLOPs a parameter a sample (forward and backward).
            stagehand.step(loss=losses[-1], tokens=args.global_batch * 8, samples=args.global_batch,
                           flops=6 * sum(w.numel() for w in model.parameters()) * args.global_batch)
        if args.snapshot:
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "data": data.get_state(),
                            "losses": losses, "step": step + 1}, args.snapshot + ".tmp")
                os.replace(args.snapshot + ".tmp", args.snapshot)
            dist.barrier()
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(f"{v:.17g}" for v in losses) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: torch 2.11's Gloo worker thread can destroy the last
    # barrier's work (holding Python tensors) while the interpreter finalizes, and abort the rank
    # ("terminate called without an active exception"; docs/programs.md, "Known issue").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
