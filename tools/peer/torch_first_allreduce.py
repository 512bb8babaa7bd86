"""Peer for the startup benchmark: under torchrun, time from the harness's start (BENCH_T0, unix seconds)
to the first NCCL all-reduce of 1M float32 done and checked, the same work as `launcher --steps=1`."""
import os
import time

import torch
import torch.distributed as dist

t0 = float(os.environ["BENCH_T0"])
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
world = dist.get_world_size()
x = torch.arange(1 << 20, device="cuda", dtype=torch.float32).remainder(1024) + rank + 1
dist.all_reduce(x)
expected = torch.arange(1 << 20, device="cuda", dtype=torch.float32).remainder(1024) * world + world * (world + 1) / 2
ok = bool(torch.equal(x, expected))
print(f"rank {rank} first_allreduce_s {time.time() - t0:.3f} ok {ok}", flush=True)
dist.destroy_process_group()
