"""diffusers/PyTorch side of bench/sd15.sh: SD1.5 (or SDXL with SDFLOW_BENCH_MODEL=sdxl)
at full size on the CPU, f32.

Same measurements as `cargo bench -p sdflow-core --bench sd15`: text encode per
prompt, one guided UNet step (cond and uncond in one batch of 2), VAE decode, peak RSS.
The modules are built from the SD1.5 / SDXL base configs with random weights (nothing
is downloaded); their cost does not depend on the weight values.

Usage: python bench/sd15_diffusers.py [threads] [sizes=256,512] [steps=4]
"""
import os
import resource
import sys
import time

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

threads = int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads()
sizes = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "256,512").split(",")]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
xl = os.environ.get("SDFLOW_BENCH_MODEL", "sd15") == "sdxl"
torch.set_num_threads(threads)
torch.manual_seed(0)

t = time.time()
clip_l = CLIPTextModel(CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                      num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu")).eval()
vae = AutoencoderKL(block_out_channels=[128, 256, 512, 512], layers_per_block=2, latent_channels=4,
                    down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4).eval()
if xl:
    name, scale = "SDXL", 0.13025
    # stabilityai/stable-diffusion-xl-base-1.0's unet/config.json and text_encoder_2.
    clip_g = CLIPTextModelWithProjection(CLIPTextConfig(
        vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
        max_position_embeddings=77, hidden_act="gelu", projection_dim=1280)).eval()
    unet = UNet2DConditionModel(
        sample_size=128, block_out_channels=[320, 640, 1280],
        down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
        transformer_layers_per_block=[1, 2, 10], attention_head_dim=[5, 10, 20], cross_attention_dim=2048,
        use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816).eval()
else:
    name, scale = "SD1.5", 0.18215
    unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8).eval()
build_s = time.time() - t


def encode(ids):
    if not xl:
        return clip_l(ids).last_hidden_state, None
    hl = clip_l(ids, output_hidden_states=True).hidden_states[-2]
    g = clip_g(ids, output_hidden_states=True)
    return torch.cat([hl, g.hidden_states[-2]], dim=-1), g.text_embeds


def peak_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)


with torch.inference_mode():
    ids = torch.randint(0, 49408, (1, 77))
    encode(ids)  # warm-up
    t = time.time()
    for _ in range(2):
        cond, pooled = encode(ids)
    text_s = (time.time() - t) / 2
    ctx = torch.cat([cond, cond])
    print(f"diffusers {name}, f32, {threads} threads, build {build_s:.1f} s, text encode {text_s:.2f} s per prompt")
    print(f"{'size':>6} {'s/step':>12} {'VAE decode s':>14} {'peak RSS GiB':>14}")
    for size in sizes:
        x = torch.randn(2, 4, size // 8, size // 8)
        tt = torch.tensor([999.0, 999.0])
        extra = {}
        if xl:
            ids6 = torch.tensor([[size, size, 0, 0, size, size]] * 2, dtype=torch.float32)
            extra = {"added_cond_kwargs": {"text_embeds": torch.cat([pooled, pooled]), "time_ids": ids6}}
        unet(x, tt, encoder_hidden_states=ctx, **extra)  # warm-up, as in the sdflow bench
        t = time.time()
        for _ in range(steps - 1):
            unet(x, tt, encoder_hidden_states=ctx, **extra)
        step_s = (time.time() - t) / max(steps - 1, 1)
        t = time.time()
        vae.decode(x[:1] / scale)  # the latent scale, as the other two engines apply it
        vae_s = time.time() - t
        print(f"{str(size) + '²':>6} {step_s:>12.2f} {vae_s:>14.2f} {peak_gib():>14.2f}")
