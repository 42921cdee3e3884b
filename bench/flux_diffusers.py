"""PyTorch's side of core/benches/flux_blocks.rs: diffusers' FluxTransformer2DModel at FLUX.1's
full width with two double and two single blocks, run at depths (1, 1), (2, 1), (2, 2) so one
double block, one single block and the rest separate; a FLUX.1-dev step (19 + 38 blocks) is
rest + 19*double + 38*single. Same shapes as sdflow's: 2x2-packed 16-channel latent, T5 at 256
tokens, batch 1 (guidance-distilled dev runs one pass per step).

Usage: python bench/flux_diffusers.py [threads] [sizes]   (env BENCH_DTYPES=bf16,f32, BENCH_REPS=2)
"""
import os
import sys
import time

import torch
from bench_common import peak_rss_gib
from diffusers import FluxPipeline, FluxTransformer2DModel

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
sizes = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "512").split(",")]
dtypes = os.environ.get("BENCH_DTYPES", "bf16").split(",")
reps = int(os.environ.get("BENCH_REPS", "2"))
torch.set_num_threads(threads)
torch.manual_seed(0)


print(f"PyTorch {torch.__version__} FLUX.1 blocks at full width, {threads} threads, T5 256 tokens, s per forward (median of {reps})")
print(f"{'weights':>8} {'size':>6} {'rest':>10} {'double':>10} {'single':>10} {'dev step (19+38)':>16} {'RSS GiB':>10}")
for dt in dtypes:
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dt]
    model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=128,
                                   num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                                   guidance_embeds=True, axes_dims_rope=[16, 56, 56]).to(dtype).eval()
    doubles, singles = model.transformer_blocks, model.single_transformer_blocks
    for size in sizes:
        h = w = size // 8
        lat = FluxPipeline._pack_latents(torch.randn(1, 16, h, w), 1, 16, h, w).to(dtype)
        img_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, "cpu", dtype)
        txt = torch.randn(1, 256, 4096, dtype=dtype)
        txt_ids = torch.zeros(256, 3, dtype=dtype)
        y = torch.randn(1, 768, dtype=dtype)

        def forward():
            return model(hidden_states=lat, encoder_hidden_states=txt, pooled_projections=y, timestep=torch.tensor([0.5], dtype=dtype),
                         img_ids=img_ids, txt_ids=txt_ids, guidance=torch.tensor([3.5], dtype=dtype), return_dict=False)[0]

        def timed(d, s):
            model.transformer_blocks = torch.nn.ModuleList(list(doubles)[:d])
            model.single_transformer_blocks = torch.nn.ModuleList(list(singles)[:s])
            with torch.inference_mode():
                forward()
                ts = []
                for _ in range(reps):
                    t = time.perf_counter()
                    forward()
                    ts.append(time.perf_counter() - t)
            return sorted(ts)[len(ts) // 2]

        a, b, c = timed(1, 1), timed(2, 1), timed(2, 2)
        double, single = b - a, c - b
        rest = a - double - single
        print(f"{dt:>8} {str(size) + '²':>6} {rest:>10.2f} {double:>10.2f} {single:>10.2f} {rest + 19 * double + 38 * single:>16.1f} {peak_rss_gib():>10.2f}")
