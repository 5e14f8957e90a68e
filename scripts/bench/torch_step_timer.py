"""What the PyTorch references of the training-step benchmarks (gpt_step_torch.py, cnn_torch.py)
share: the thread count from OMP_NUM_THREADS, and timing a step after two warm-up steps, printed as
the one line the Lua side reads: `torch_ms <median> <min>`."""
import os
import time

import torch


def set_threads():
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))


def report(step, steps):
    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    print("torch_ms %.3f %.3f" % (times[len(times) // 2], times[0]))
