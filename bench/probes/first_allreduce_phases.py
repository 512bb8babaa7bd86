"""tools/peer/torch_first_allreduce.py with its phases: seconds from BENCH_T0 (unix seconds, set just
before the launch command) to the interpreter's first line, `import torch` done, the CUDA context
made, init_process_group (NCCL, eager with device_id) done, and the first all-reduce checked. Run by
bench/probes/program_startup_phases.sh under the launcher and under torchrun."""
import os
import time

t_py = time.time()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

t_import = time.time()
t0 = float(os.environ["BENCH_T0"])
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
t_cuda = time.time()
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
t_pg = time.time()
world = dist.get_world_size()
x = torch.arange(1 << 20, device="cuda", dtype=torch.float32).remainder(1024) + rank + 1
dist.all_reduce(x)
expected = torch.arange(1 << 20, device="cuda", dtype=torch.float32).remainder(1024) * world + world * (world + 1) / 2
ok = bool(torch.equal(x, expected))
t_ar = time.time()
print(f"phases rank {rank} python {t_py - t0:.3f} import {t_import - t0:.3f} cuda {t_cuda - t0:.3f} "
      f"pg {t_pg - t0:.3f} allreduce {t_ar - t0:.3f} ok {ok}", flush=True)
dist.destroy_process_group()
