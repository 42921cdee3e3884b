"""transformers' Qwen3Model (Qwen3-4B, random weights) on the CPU, timed as
core/benches/llm.rs times sdflow's: seconds per prompt at each token count (all 36 layers,
the final state), the median of REPS after a warm-up, under torch.inference_mode, and the
process's peak RSS.

Env: TOKENS="32,512", REPS=2, THREADS=2, DTYPE=bf16 (or f32: PyTorch's fastest on a CPU
without bf16 units).
Run: python bench/llm_transformers.py
"""
import os
import resource

import torch
from bench_common import median_seconds
from transformers import Qwen3Config, Qwen3Model

threads = int(os.environ.get("THREADS", "2"))
reps = int(os.environ.get("REPS", "2"))
tokens = [int(t) for t in os.environ.get("TOKENS", "32,512").split(",")]
dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[os.environ.get("DTYPE", "bf16")]
torch.set_num_threads(threads)
torch.manual_seed(0)
config = Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960)
with torch.device("meta"):
    model = Qwen3Model(config)
model = model.to_empty(device="cpu").to(dtype)
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.02)
model.eval()
name = os.environ.get("DTYPE", "bf16")
print(f"torch {torch.__version__} Qwen3-4B {name}, {threads} threads, s per prompt (median of {reps})")
with torch.inference_mode():
    for n in tokens:
        ids = (torch.arange(n) * 7919 % 150000).unsqueeze(0)
        median = median_seconds(lambda: model(ids), reps)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"{name:>8} {n:>7} {median:>8.2f} {rss:>10.2f}")
