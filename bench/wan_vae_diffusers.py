"""diffusers' side of the Wan VAE row in cli/benches/dit_sdcpp.rs (SDFLOW_BENCH_MODEL=wan):
AutoencoderKLWan (Wan 2.1: base 96, z 16, random weights) decoding one video's latent of
`frames` frames at WxH in bf16 (its fastest CPU dtype here), timed once after a one-latent-frame
warm-up, in its own process so the peak RSS is this decode's. Prints `RESULT vae=<seconds>`.

Usage: python bench/wan_vae_diffusers.py [threads] [frames] [WxH]   (env BENCH_DTYPE=bf16|f32)
"""
import os
import sys
import time

import torch
from bench_common import peak_rss_gib
from diffusers import AutoencoderKLWan

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
frames = int(sys.argv[2]) if len(sys.argv) > 2 else 9
width, height = (int(v) for v in (sys.argv[3] if len(sys.argv) > 3 else "832x480").split("x"))
dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[os.environ.get("BENCH_DTYPE", "bf16")]
torch.set_num_threads(threads)
torch.manual_seed(0)

vae = AutoencoderKLWan(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, temperal_downsample=[False, True, True]).to(dtype).eval()
t = (frames - 1) // 4 + 1
with torch.inference_mode():
    vae.decode(torch.randn(1, 16, 1, height // 8, width // 8, dtype=dtype))
    lat = torch.randn(1, 16, t, height // 8, width // 8, dtype=dtype)
    s = time.perf_counter()
    out = vae.decode(lat).sample
    secs = time.perf_counter() - s
print(f"PyTorch {torch.__version__} AutoencoderKLWan {dtype}, {threads} threads, {frames} frames ({t} latent) at {width}x{height}: {secs:.2f} s, output {tuple(out.shape)}, peak RSS {peak_rss_gib():.2f} GiB")
print(f"RESULT vae={secs:.3f}")
