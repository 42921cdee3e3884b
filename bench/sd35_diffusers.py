"""diffusers' side of cli/benches/flux_sdcpp.rs with SDFLOW_BENCH_MODEL=sd35m: SD3.5 medium at
full size in PyTorch's fastest CPU dtype here (bf16), random weights, the same work per image as
sd-cli's: the three text encoders on the prompt and the empty negative (CLIP-L and OpenCLIP-G at
77 tokens, T5-XXL at 77, as sd.cpp pads them: 154 text tokens), a CFG step as one batch-2 pass of
SD3Transformer2DModel (MMDiT-X, blocks 0..12 with the second attention), and the 16-channel VAE
decode. The first step is a warm-up, not timed.

Usage: python bench/sd35_diffusers.py [threads] [size] [steps]
"""
import sys
import time

import torch
from bench_common import peak_rss_gib
from diffusers import AutoencoderKL, SD3Transformer2DModel
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
size = int(sys.argv[2]) if len(sys.argv) > 2 else 512
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
torch.set_num_threads(threads)
torch.manual_seed(0)
dtype = torch.bfloat16
torch.set_default_dtype(dtype)


t0 = time.perf_counter()
clip_l = CLIPTextModelWithProjection(CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                                    num_attention_heads=12, projection_dim=768, hidden_act="quick_gelu")).eval()
clip_g = CLIPTextModelWithProjection(CLIPTextConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                                                    num_attention_heads=20, projection_dim=1280, hidden_act="gelu")).eval()
t5 = T5EncoderModel(T5Config(d_model=4096, d_kv=64, num_heads=64, d_ff=10240, num_layers=24, vocab_size=32128,
                             feed_forward_proj="gated-gelu", relative_attention_num_buckets=32)).eval()
model = SD3Transformer2DModel(sample_size=size // 8, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
                              num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
                              pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=384,
                              dual_attention_layers=tuple(range(13)), qk_norm="rms_norm").eval()
vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
                    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                    layers_per_block=2, use_quant_conv=False, use_post_quant_conv=False).eval()
build = time.perf_counter() - t0

ids = torch.randint(0, 30000, (1, 77))
with torch.inference_mode():
    t = time.perf_counter()
    for _ in range(2):  # prompt and negative, as sd.cpp encodes both at cfg != 1
        l = clip_l(ids, output_hidden_states=True)
        g = clip_g(ids, output_hidden_states=True)
        e = t5(ids).last_hidden_state
    text = time.perf_counter() - t  # both prompts, as the other engines' figures
    h = w = size // 8
    lat = torch.randn(2, 16, h, w)
    ctx = torch.randn(2, 154, 4096)
    pooled = torch.randn(2, 2048)
    ts = []
    for i in range(steps):
        t = time.perf_counter()
        model(hidden_states=lat, encoder_hidden_states=ctx, pooled_projections=pooled, timestep=torch.tensor([500.0, 500.0]), return_dict=False)
        if i > 0:
            ts.append(time.perf_counter() - t)
    t = time.perf_counter()
    vae.decode(torch.randn(1, 16, h, w), return_dict=False)
    decode = time.perf_counter() - t
step = sum(ts) / len(ts) if ts else float("nan")
print(f"diffusers {__import__('diffusers').__version__} on PyTorch {torch.__version__}, bf16, {threads} threads, {size}², built in {build:.0f} s")
print(f"RESULT sd35m bf16 diffusers step={step:.2f} text={text:.2f} vae={decode:.2f} rss={peak_rss_gib():.2f}")
