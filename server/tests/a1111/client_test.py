"""The PyPI A1111 client `webuiapi` (0.9.17) against `sdflow serve` (server/tests/a1111_client.rs
starts the server on a tiny SD1 checkpoint and runs this with its address): the calls an
A1111 script makes, each with the client's own full default payload. Prints one JSON
object of what came back; the Rust test checks it.

Run: python client_test.py HOST PORT
"""
import base64
import io
import json
import sys

import webuiapi
from PIL import Image

host, port = sys.argv[1], int(sys.argv[2])
api = webuiapi.WebUIApi(host=host, port=port, sampler="Euler a", steps=2)
out = {}

out["models"] = [m["model_name"] for m in api.get_sd_models()]
api.util_set_model(out["models"][0])
out["current_model"] = api.util_get_current_model()
out["samplers"] = api.util_get_sampler_names()
out["schedulers"] = api.util_get_scheduler_names()

r = api.txt2img(prompt="a cat", negative_prompt="blurry", seed=5, width=64, height=64, batch_size=2, n_iter=2, cfg_scale=5)
out["txt2img"] = {"images": len(r.images), "size": list(r.image.size), "seeds": r.info["all_seeds"]}

r = api.txt2img(prompt="a cat", seed=5, width=32, height=32, enable_hr=True, hr_scale=2, hr_upscaler=webuiapi.HiResUpscaler.Latent, hr_second_pass_steps=1, denoising_strength=0.5)
out["hires"] = list(r.image.size)

first = r.image
r = api.img2img(images=[first], prompt="a dog", seed=3, width=64, height=64, denoising_strength=0.5)
out["img2img"] = list(r.image.size)
mask = Image.new("L", first.size, 0)
mask.paste(255, (first.size[0] // 2, 0, first.size[0], first.size[1]))
r = api.img2img(images=[first], mask_image=mask, prompt="a dog", seed=3, width=64, height=64, inpainting_fill=1, inpaint_full_res=False)
out["inpaint"] = list(r.image.size)
# The client's own inpainting defaults: masked content "fill", inpaint area "only masked".
try:
    r = api.img2img(images=[first], mask_image=mask, prompt="a dog", seed=3, width=64, height=64)
    out["inpaint_defaults"] = list(r.image.size)
except RuntimeError as e:
    out["inpaint_defaults"] = {"status": e.args[0], "text": e.args[1]}

# eta unset: a graph of plain KSamplers, which sdflow writes A1111 parameters for.
plain = api.txt2img(prompt="a red fox", seed=9, width=64, height=64, eta=None).image
info = api.png_info(plain)
out["png_info"] = info.info
# Seamless tiling (circular padding).
out["tiling"] = list(api.txt2img(prompt="x", width=64, height=48, tiling=True).image.size)

# The ControlNet extension's routes, and a unit with the client's own defaults (module
# none, "Resize and Fill") in alwayson_scripts.
out["controlnet_version"] = api.controlnet_version()
out["controlnet_models"] = api.controlnet_model_list()
out["controlnet_modules"] = api.controlnet_module_list()
unit = webuiapi.ControlNetUnit(image=first, model=out["controlnet_models"][0])
r = api.txt2img(prompt="a cat", seed=5, width=64, height=48, controlnet_units=[unit])
out["controlnet"] = list(r.image.size)

out["progress"] = api.get_progress()["progress"]
api.set_options({"CLIP_stop_at_last_layers": 2})
out["clip_skip"] = api.get_options()["CLIP_stop_at_last_layers"]
api.set_options({"CLIP_stop_at_last_layers": 1})
out["upscalers"] = [u["name"] for u in api.get_upscalers()]
out["latent_modes"] = [m["name"] for m in api.get_latent_upscale_modes()]
print(json.dumps(out))
