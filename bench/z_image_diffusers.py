"""PyTorch's side of the Z-Image row in cli/benches/dit_sdcpp.rs: diffusers' ZImageTransformer2DModel
at Z-Image's full width (3840, 30 heads, its two noise and two context refiners) but with 1 and 2
main layers, so one layer's time is the difference; a step of the 30-layer model is
depth-1 + 29 * layer. The 6B model itself does not fit in f32 beside anything else on a 24 GiB
machine. Same shapes as the sdflow run: a 16-channel latent at size/8 in 2x2 patches, a caption
of 17 Qwen3 tokens (padded to 32 as the model pads), batch 1 (Turbo at cfg 1: one pass per step).

Usage: python bench/z_image_diffusers.py [threads] [size]   (env BENCH_DTYPES=f32,bf16, BENCH_REPS=2)
"""
import os
import sys

import torch
from bench_common import median_seconds, peak_rss_gib
from diffusers import ZImageTransformer2DModel

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
size = int(sys.argv[2]) if len(sys.argv) > 2 else 512
dtypes = os.environ.get("BENCH_DTYPES", "f32,bf16").split(",")
reps = int(os.environ.get("BENCH_REPS", "2"))
torch.set_num_threads(threads)
torch.manual_seed(0)


print(f"PyTorch {torch.__version__} Z-Image at full width, {threads} threads, {size}², s per forward (median of {reps} after a warm-up)")
print(f"{'weights':>8} {'depth 1':>10} {'layer':>10} {'step (1 + 29 layers)':>22} {'RSS GiB':>10}")
for dt in dtypes:
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dt]
    times = {}
    for layers in (1, 2):
        model = ZImageTransformer2DModel(n_layers=layers).to(dtype).eval()
        x = [torch.randn(16, 1, size // 8, size // 8, dtype=dtype)]
        cap = [torch.randn(17, 2560, dtype=dtype)]
        t = torch.tensor([0.5], dtype=dtype)
        with torch.no_grad():
            times[layers] = median_seconds(lambda: model(x, t, cap, return_dict=False), reps)
        del model
    layer = times[2] - times[1]
    step = times[1] + 29 * layer
    print(f"{dt:>8} {times[1]:>10.2f} {layer:>10.2f} {step:>22.1f} {peak_rss_gib():>10.1f}")
    print(f"RESULT dtype={dt} step={step:.3f} layer={layer:.3f} rss={peak_rss_gib():.2f}")
