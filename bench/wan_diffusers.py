"""PyTorch's side of core/benches/wan_blocks.rs: diffusers' WanTransformer3DModel at Wan 2.1
T2V 1.3B's full width (1536, 12 heads of 128, FFN 8960) with two blocks, run at depths 1 and 2
so one block and the rest separate; a pass of the 30-block model is rest + 30*block. Same
shapes as sdflow's: 480x832 videos of 9 and 33 frames (3 and 9 latent frames), UMT5 states at
512 tokens, batch 1 (one side of CFG).

Usage: python bench/wan_diffusers.py [threads] [frames] [WxH]   (env BENCH_DTYPES=bf16,f32, BENCH_REPS=1)
"""
import os
import sys
import time

import torch
from bench_common import peak_rss_gib
from diffusers import WanTransformer3DModel

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
frames = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "9,33").split(",")]
width, height = (int(v) for v in (sys.argv[3] if len(sys.argv) > 3 else "832x480").split("x"))
dtypes = os.environ.get("BENCH_DTYPES", "bf16").split(",")
reps = int(os.environ.get("BENCH_REPS", "1"))
torch.set_num_threads(threads)
torch.manual_seed(0)

print(f"PyTorch {torch.__version__} Wan 2.1 1.3B blocks at full width, {threads} threads, {width}x{height}, UMT5 512 tokens, s per pass (median of {reps})")
print(f"{'weights':>8} {'frames':>7} {'tokens':>7} {'rest':>10} {'block':>10} {'pass (30 blocks)':>16} {'RSS GiB':>10}")
for dt in dtypes:
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dt]
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
                                  text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=2, cross_attn_norm=True,
                                  qk_norm="rms_norm_across_heads", eps=1e-6).to(dtype).eval()
    blocks = model.blocks
    for f in frames:
        t = (f - 1) // 4 + 1
        lat = torch.randn(1, 16, t, height // 8, width // 8, dtype=dtype)
        txt = torch.randn(1, 512, 4096, dtype=dtype)

        def timed(d):
            model.blocks = torch.nn.ModuleList(list(blocks)[:d])
            with torch.inference_mode():
                model(hidden_states=lat, timestep=torch.tensor([500.0]), encoder_hidden_states=txt, return_dict=False)
                ts = []
                for _ in range(reps):
                    s = time.perf_counter()
                    model(hidden_states=lat, timestep=torch.tensor([500.0]), encoder_hidden_states=txt, return_dict=False)
                    ts.append(time.perf_counter() - s)
            return sorted(ts)[len(ts) // 2]

        one, two = timed(1), timed(2)
        block = two - one
        rest = one - block
        tokens = t * (height // 16) * (width // 16)
        print(f"{dt:>8} {f:>7} {tokens:>7} {rest:>10.2f} {block:>10.2f} {rest + 30 * block:>16.1f} {peak_rss_gib():>10.2f}")
