"""transformers' T5EncoderModel (T5-XXL v1.1's encoder, random weights) in bf16 on the CPU,
timed as core/benches/t5.rs times sdflow's: seconds per prompt at each token count, the
median of REPS after a warm-up, under torch.inference_mode.

Env: TOKENS="77,256", REPS=2, THREADS=2.
Run: python bench/t5_transformers.py
"""
import os

import torch
from bench_common import median_seconds
from transformers import T5Config, T5EncoderModel

threads = int(os.environ.get("THREADS", "2"))
reps = int(os.environ.get("REPS", "2"))
tokens = [int(t) for t in os.environ.get("TOKENS", "77,256").split(",")]
torch.set_num_threads(threads)
torch.manual_seed(0)
config = T5Config(d_model=4096, d_kv=64, num_heads=64, d_ff=10240, num_layers=24, vocab_size=32128,
                  feed_forward_proj="gated-gelu", is_encoder_decoder=False)
with torch.device("meta"):
    model = T5EncoderModel(config)
model = model.to_empty(device="cpu").to(torch.bfloat16)
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.02)
model.eval()
print(f"torch {torch.__version__} T5-XXL encoder bf16, {threads} threads, s per prompt (median of {reps})")
with torch.inference_mode():
    for n in tokens:
        ids = (torch.arange(n) * 7919 % 32000 + 3).unsqueeze(0)
        median = median_seconds(lambda: model(ids), reps)
        print(f"{'bf16':>8} {n:>7} {median:>8.2f}")
