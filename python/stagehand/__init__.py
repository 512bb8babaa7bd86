"""stagehand: what a program run by `launcher -- PROGRAM` tells the launcher, with no dependency.

    import stagehand
    for batch in loader:
        loss = train_step(batch)
        stagehand.step(loss=loss.item(), tokens=batch.numel())

Each call ends a step: the launcher prints the progress line, appends the step to steps.csv, counts
it for report.json (step time, tokens/s, samples/s, and TFLOP/s and MFU from the FLOPs given) and,
once a rank has reported a step, stops the job as hung when that rank reports no more for
--progress_timeout_ms. Call it on every rank (the loss from any rank that has it). `launcher
--sweep=1,2,4 -- PROGRAM` compares the runs by tokens/s, else samples/s, else steps/s. Outside the
launcher (STAGEHAND_STEPS_FILE unset) it does nothing.
"""
import math
import os
import time

__all__ = ["step"]

_path = os.environ.get("STAGEHAND_STEPS_FILE", "")
_fd = -1
_step = 0
_last = time.monotonic()


def step(loss=None, tokens=None, samples=None, flops=None):
    """Ends a step: its time (since the previous call, or since import), and what the caller knows.

    loss: a number (a tensor's .item()); tokens, samples: what this step processed on the whole
    job (the global batch), for the throughput; flops: the floating-point operations of this step on
    the whole job (every rank's together, the same number on each rank, as tokens), for TFLOP/s and,
    on GPUs, MFU against --peak_tflops (FLOPs that are not a finite number of 0 or more are left out).
    """
    global _fd, _step, _last
    now = time.monotonic()
    seconds, _last = now - _last, now
    if not _path:
        _step += 1
        return
    if _fd < 0:
        _fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fields = [f"step={_step}", f"seconds={seconds:.6f}"]
    if loss is not None:
        value = float(loss)
        fields.append(f"loss={value!r}" if math.isfinite(value) else f"loss={'nan' if value != value else 'inf'}")
    if tokens is not None:
        fields.append(f"tokens={int(tokens)}")
    if samples is not None:
        fields.append(f"samples={int(samples)}")
    if flops is not None and math.isfinite(float(flops)) and float(flops) >= 0:
        fields.append(f"flops={float(flops)!r}")
    os.write(_fd, (" ".join(fields) + "\n").encode())  # one write: a whole line, appended
    _step += 1
