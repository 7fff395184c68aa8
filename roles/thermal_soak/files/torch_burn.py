#!/usr/bin/env python3
"""Keep one GPU busy with bf16 matmuls for a fixed time (thermal soak loader shipped by roles/thermal_soak).

Usage: torch_burn.py --seconds S [--device N] [--size 8192] [--report-s 10]
Run one process per GPU (the role sets CUDA_VISIBLE_DEVICES and --device 0, --gpu-label <index>). Every report-s
seconds it prints `TFLOPS gpu=<label> t=<elapsed s> tflops=<achieved>` so a throughput drop under heat is visible.
Exits 0 after S seconds; non-zero (with the error) when CUDA is unusable.
"""
import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--gpu-label", default=None)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--report-s", type=float, default=10.0)
    a = ap.parse_args()
    import torch  # imported after the arguments are read: torch is only on the GPU hosts

    if not torch.cuda.is_available():
        print("torch.cuda.is_available() is False", file=sys.stderr)
        return 3
    label = a.gpu_label if a.gpu_label is not None else str(a.device)
    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    n = a.size
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    out = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    flop = 2.0 * n * n * n
    start = time.time()
    last, done = start, 0
    print("BURN start gpu=%s name=%s size=%d seconds=%s" % (label, torch.cuda.get_device_name(dev), n, a.seconds),
          flush=True)
    while True:
        for _ in range(20):
            torch.matmul(x, y, out=out)
        torch.cuda.synchronize(dev)
        done += 20
        now = time.time()
        if now - last >= a.report_s:
            print("TFLOPS gpu=%s t=%.1f tflops=%.1f" % (label, now - start, done * flop / (now - last) / 1e12),
                  flush=True)
            last, done = now, 0
        if now - start >= a.seconds:
            break
    print("BURN done gpu=%s" % label, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
