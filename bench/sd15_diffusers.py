"""diffusers/PyTorch side of bench/sd15.sh: SD1.5 at full size on the CPU, f32.

Same measurements as `cargo bench -p sdflow-core --bench sd15`: text encode per
prompt, one guided UNet step (cond and uncond in one batch of 2), VAE decode, peak RSS.
The modules are built from the SD1.5 configs with random weights (nothing is
downloaded); their cost does not depend on the weight values.

Usage: python bench/sd15_diffusers.py [threads] [sizes=256,512] [steps=4]
"""
import resource
import sys
import time

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel

threads = int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads()
sizes = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "256,512").split(",")]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
torch.set_num_threads(threads)
torch.manual_seed(0)

t = time.time()
clip = CLIPTextModel(CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                    num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu")).eval()
unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8).eval()
vae = AutoencoderKL(block_out_channels=[128, 256, 512, 512], layers_per_block=2, latent_channels=4,
                    down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4).eval()
build_s = time.time() - t


def peak_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)


with torch.inference_mode():
    ids = torch.randint(0, 49408, (1, 77))
    clip(ids)  # warm-up
    t = time.time()
    for _ in range(2):
        cond = clip(ids).last_hidden_state
    text_s = (time.time() - t) / 2
    ctx = torch.cat([cond, cond])
    print(f"diffusers SD1.5, f32, {threads} threads, build {build_s:.1f} s, text encode {text_s:.2f} s per prompt")
    print(f"{'size':>6} {'s/step':>12} {'VAE decode s':>14} {'peak RSS GiB':>14}")
    for size in sizes:
        x = torch.randn(2, 4, size // 8, size // 8)
        tt = torch.tensor([999.0, 999.0])
        unet(x, tt, encoder_hidden_states=ctx)  # warm-up, as in the sdflow bench
        t = time.time()
        for _ in range(steps - 1):
            unet(x, tt, encoder_hidden_states=ctx)
        step_s = (time.time() - t) / max(steps - 1, 1)
        t = time.time()
        vae.decode(x[:1] / 0.18215)  # the latent scale, as the other two engines apply it
        vae_s = time.time() - t
        print(f"{str(size) + '²':>6} {step_s:>12.2f} {vae_s:>14.2f} {peak_gib():>14.2f}")
