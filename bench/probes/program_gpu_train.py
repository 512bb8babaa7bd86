"""A torchrun-style DDP script on GPUs (NCCL) for bench/probes/program_one_gpu.sh: a bf16 MLP of four
4096-wide layers trained on random data, each rank on the GPU its LOCAL_RANK names, reporting every
step through `stagehand` (loss, tokens, samples and the step's FLOPs). --fail_step S raises on rank
--fail_rank there (after printing the time it raised); --hang_step S sleeps there instead.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import stagehand  # on PYTHONPATH under the launcher; does nothing outside it

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--batch", type=int, default=8192, help="rows per rank and step")
p.add_argument("--width", type=int, default=4096)
p.add_argument("--fail_rank", type=int, default=0)
p.add_argument("--fail_step", type=int, default=-1)
p.add_argument("--hang_step", type=int, default=-1)
a = p.parse_args()

local = int(os.environ["LOCAL_RANK"])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
torch.manual_seed(0)
layers = []
for _ in range(4):
    layers += [torch.nn.Linear(a.width, a.width), torch.nn.GELU()]
model = DDP(torch.nn.Sequential(*layers[:-1]).cuda().to(torch.bfloat16), device_ids=[local])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
params = sum(w.numel() for w in model.parameters())
gen = torch.Generator(device="cuda").manual_seed(1 + rank)
target = torch.nn.Linear(a.width, a.width).cuda().to(torch.bfloat16).requires_grad_(False)
print(f"rank {rank} of {world}: LOCAL_RANK {local}, device {torch.cuda.current_device()} "
      f"({torch.cuda.get_device_name()}), CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
for step in range(a.steps):
    if rank == a.fail_rank and step == a.fail_step:
        print(f"raising at {time.time():.3f}", flush=True)
        raise RuntimeError(f"injected failure at step {step} on rank {rank}")
    if rank == a.fail_rank and step == a.hang_step:
        time.sleep(3600)
    x = torch.randn(a.batch, a.width, device="cuda", dtype=torch.bfloat16, generator=gen)
    loss = torch.nn.functional.mse_loss(model(x).float(), target(x).float())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    total = loss.detach()
    dist.all_reduce(total)
    value = total.item() / world
    if rank == 0 and step % 10 == 0:
        print(f"step {step} loss {value:.5f}", flush=True)
    # The whole job's: every rank's rows, 6 FLOPs a parameter a row (forward and backward).
    stagehand.step(loss=value, tokens=a.batch * world, samples=a.batch * world, flops=6 * params * a.batch * world)
dist.destroy_process_group()
