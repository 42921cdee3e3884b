#!/usr/bin/env python3
"""Convert Real-ESRGAN ncnn models (.param + .bin) into safetensors with basicsr names.

    python3 tools/ncnn2safetensors.py MODEL.param MODEL.bin OUT.safetensors

Handles the two architectures Real-ESRGAN ships for ncnn:

- RRDBNet (x4plus, x4plus-anime-6B): conv_first, body.N.rdbR.convK, conv_body,
  conv_up1, conv_up2, conv_hr, conv_last;
- SRVGGNetCompact (animevideov3, general-x4v3): body.N convolutions and PReLU slopes.

The graph is walked and checked against the architecture (layer order, activations,
residual coefficients, upsampling mode, channel counts), so a model of another shape
fails with a message instead of being mislabelled. Only the Python standard library is
used: weights are copied in their stored type (ncnn's fp16 convolution kernels stay F16,
its f32 biases and slopes stay F32); loaders convert at load time.

ncnn formats, as read here:
- .param: a magic line (7767517), a "layers blobs" count line, then one line per layer:
  type, name, input count, output count, input blob names, output blob names, then
  `key=value` parameters (a negative key -23300-k introduces an array `count,v1,v2...`
  for key k).
- .bin: each layer's weights in layer order. A Convolution stores its kernel (weight
  data size `6=`) behind a 4-byte tag — 0x01306B47 fp16, 0x00000000 f32, 0x000D4B38 int8
  (unsupported here) — then, if `5=1`, its bias as raw f32. A PReLU stores `0=` slopes
  as raw f32. Other layers used by these models have no weights.
"""

import json
import struct
import sys

FP16_TAG = 0x01306B47
F32_TAG = 0x00000000


class ConvertError(Exception):
    pass


def parse_param(path):
    with open(path, encoding="utf-8") as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    if not lines or lines[0] != "7767517":
        raise ConvertError(f"{path}: not an ncnn text .param file (magic line {lines[0] if lines else ''!r})")
    try:
        n_layers, _ = (int(x) for x in lines[1].split())
    except ValueError:
        raise ConvertError(f"{path}: bad layer/blob count line {lines[1]!r}")
    layers = []
    for no, ln in enumerate(lines[2:], start=3):
        parts = ln.split()
        if len(parts) < 4:
            raise ConvertError(f"{path}:{no}: too few fields")
        ltype, name = parts[0], parts[1]
        try:
            nin, nout = int(parts[2]), int(parts[3])
        except ValueError:
            raise ConvertError(f"{path}:{no}: bad input/output counts")
        if len(parts) < 4 + nin + nout:
            raise ConvertError(f"{path}:{no}: {name} lists fewer blobs than it declares")
        ins = parts[4:4 + nin]
        outs = parts[4 + nin:4 + nin + nout]
        params = {}
        for kv in parts[4 + nin + nout:]:
            if "=" not in kv:
                raise ConvertError(f"{path}:{no}: {name}: parameter {kv!r} is not key=value")
            k, v = kv.split("=", 1)
            k = int(k)
            if k <= -23300:
                vals = v.split(",")
                params[-k - 23300] = [float(x) for x in vals[1:]]
            else:
                params[k] = float(v) if ("." in v or "e" in v) else int(v)
        layers.append({"type": ltype, "name": name, "in": ins, "out": outs, "p": params, "line": no})
    if len(layers) != n_layers:
        raise ConvertError(f"{path}: header says {n_layers} layers, found {len(layers)}")
    return layers


class BinReader:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        self.path = path
        self.pos = 0

    def take(self, n, what):
        if self.pos + n > len(self.data):
            raise ConvertError(f"{self.path}: ends inside {what} (needs {n} bytes at offset {self.pos}, file has {len(self.data)})")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def tagged(self, count, what):
        """A weight blob with its type tag: (dtype, bytes)."""
        (tag,) = struct.unpack("<I", self.take(4, f"{what} tag"))
        if tag == FP16_TAG:
            raw = self.take(count * 2, what)
            self.take((-count * 2) % 4, f"{what} padding")
            return "F16", raw
        if tag == F32_TAG:
            return "F32", self.take(count * 4, what)
        raise ConvertError(f"{self.path}: {what}: unsupported weight tag 0x{tag:08X} (only fp16 and f32 are)")

    def raw_f32(self, count, what):
        return "F32", self.take(count * 4, what)


def read_weights(layers, bin_path):
    """Walk the layers in file order; return the Convolution and PReLU layers with data."""
    rd = BinReader(bin_path)
    out = []
    for l in layers:
        p = l["p"]
        if l["type"] == "Convolution":
            cout, k = p.get(0), p.get(1)
            dil, stride, pad = p.get(2, 1), p.get(3, 1), p.get(4, 0)
            kh = p.get(11, k)
            size = p.get(6)
            if None in (cout, k, size) or kh != k or dil != 1 or stride != 1 or pad != k // 2:
                raise ConvertError(f"line {l['line']}: {l['name']}: only stride-1, 'same'-padded square convolutions are supported ({p})")
            if size % (cout * k * k):
                raise ConvertError(f"line {l['line']}: {l['name']}: weight size {size} is not out·k·k·in")
            cin = size // (cout * k * k)
            act = p.get(9, 0)
            if act not in (0, 2):
                raise ConvertError(f"line {l['line']}: {l['name']}: fused activation {act} is not supported")
            slope = None
            if act == 2:
                slope = p.get(10, [0.0])[0] if isinstance(p.get(10), list) else 0.0
            w = rd.tagged(size, f"{l['name']} weight")
            b = rd.raw_f32(cout, f"{l['name']} bias") if p.get(5, 0) == 1 else None
            out.append(dict(l, kind="conv", cin=cin, cout=cout, k=k, weight=w, bias=b, lrelu=slope))
        elif l["type"] == "PReLU":
            n = p.get(0, 1)
            out.append(dict(l, kind="prelu", n=n, slope=rd.raw_f32(n, f"{l['name']} slope")))
        elif l["type"] in ("Input", "Split", "Concat", "Eltwise", "BinaryOp", "Interp", "PixelShuffle"):
            pass
        else:
            raise ConvertError(f"line {l['line']}: layer type {l['type']} ({l['name']}) is not part of RRDBNet or SRVGGNetCompact")
    if rd.pos != len(rd.data):
        raise ConvertError(f"{bin_path}: {len(rd.data) - rd.pos} bytes left after the last weight: the .bin does not match the .param")
    return out


def check(cond, msg):
    if not cond:
        raise ConvertError(msg)


def convert_rrdb(layers, weighted):
    convs = [w for w in weighted if w["kind"] == "conv"]
    check(all(w["kind"] == "conv" for w in weighted), "RRDBNet has no PReLU layers")
    check((len(convs) - 6) % 15 == 0 and len(convs) > 6, f"{len(convs)} convolutions do not make an RRDBNet (15 per block + 6)")
    nb = (len(convs) - 6) // 15
    nf = convs[0]["cout"]
    gc = convs[1]["cout"]
    names = ["conv_first"]
    for b in range(nb):
        for r in range(1, 4):
            names += [f"body.{b}.rdb{r}.conv{k}" for k in range(1, 6)]
    names += ["conv_body", "conv_up1", "conv_up2", "conv_hr", "conv_last"]
    for i, (n, c) in enumerate(zip(names, convs)):
        check(c["k"] == 3, f"{c['name']} ({n}): kernel {c['k']}, expected 3")
        if n == "conv_first":
            cin, cout, lrelu = 3, nf, False
        elif n.startswith("body."):
            k = int(n[-1])
            cin, cout, lrelu = nf + (k - 1) * gc, (nf if k == 5 else gc), k < 5
        elif n == "conv_last":
            cin, cout, lrelu = nf, 3, False
        else:
            cin, cout, lrelu = nf, nf, n != "conv_body"
        check((c["cin"], c["cout"]) == (cin, cout), f"{c['name']} ({n}): {c['cin']}→{c['cout']} channels, expected {cin}→{cout}")
        check((c["lrelu"] is not None) == lrelu, f"{c['name']} ({n}): leaky ReLU {'missing' if lrelu else 'unexpected'}")
        if lrelu:
            check(abs(c["lrelu"] - 0.2) < 1e-6, f"{c['name']}: leaky ReLU slope {c['lrelu']}, expected 0.2")
    # Residual scaling: every Eltwise is 0.2·a + 1·b; both upsamplings nearest ×2.
    for l in layers:
        if l["type"] == "Eltwise":
            coeffs = l["p"].get(1)
            check(l["p"].get(0) == 1 and coeffs is not None and [round(c, 6) for c in coeffs] == [0.2, 1.0],
                  f"{l['name']}: Eltwise {l['p']}, expected sum with coefficients 0.2, 1")
    interps = [l for l in layers if l["type"] == "Interp"]
    check(len(interps) == 2 and all(l["p"].get(0) == 1 and l["p"].get(1) == 2.0 and l["p"].get(2) == 2.0 for l in interps),
          "RRDBNet upsampling must be two nearest ×2 Interp layers")
    return {n: c for n, c in zip(names, convs)}, {"arch": "RRDBNet", "num_block": nb, "num_feat": nf, "num_grow_ch": gc, "scale": 4}


def convert_compact(layers, weighted):
    kinds = [w["kind"] for w in weighted]
    n = len(weighted)
    check(n >= 5 and n % 2 == 1 and kinds == ["conv", "prelu"] * (n // 2) + ["conv"],
          "SRVGGNetCompact must alternate convolution and PReLU, ending in a convolution")
    nf = weighted[0]["cout"]
    for i, w in enumerate(weighted[:-1]):
        if w["kind"] == "conv":
            check(w["cin"] == (3 if i == 0 else nf) and w["cout"] == nf and w["lrelu"] is None,
                  f"{w['name']} (body.{i}): {w['cin']}→{w['cout']}, expected {3 if i == 0 else nf}→{nf} without activation")
        else:
            check(w["n"] == nf, f"{w['name']} (body.{i}): {w['n']} slopes, expected {nf}")
    shuffles = [l for l in layers if l["type"] == "PixelShuffle"]
    check(len(shuffles) == 1, "SRVGGNetCompact needs exactly one PixelShuffle")
    r = shuffles[0]["p"].get(0)
    last = weighted[-1]
    check(last["cin"] == nf and last["cout"] == 3 * r * r, f"{last['name']}: {last['cin']}→{last['cout']}, expected {nf}→{3 * r * r}")
    # The released ncnn files apply the network at ×4 and may resize afterwards (the
    # _UP2X/_UP3X variants); the network itself is the pixel-shuffle factor.
    nearest = [l for l in layers if l["type"] == "Interp" and l["p"].get(0) == 1]
    check(len(nearest) == 1 and nearest[0]["p"].get(1) == float(r), f"the skip connection must be a nearest ×{r} Interp")
    return {f"body.{i}": w for i, w in enumerate(weighted)}, {"arch": "SRVGGNetCompact", "num_conv": n // 2 - 1, "num_feat": nf, "upscale": r}


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    blobs = []
    off = 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def convert(param_path, bin_path, out_path):
    layers = parse_param(param_path)
    weighted = read_weights(layers, bin_path)
    if any(w["kind"] == "prelu" for w in weighted):
        named, meta = convert_compact(layers, weighted)
    else:
        named, meta = convert_rrdb(layers, weighted)
    tensors = {}
    for name, w in named.items():
        if w["kind"] == "conv":
            dt, raw = w["weight"]
            tensors[f"{name}.weight"] = (dt, [w["cout"], w["cin"], w["k"], w["k"]], raw)
            if w["bias"] is not None:
                tensors[f"{name}.bias"] = (w["bias"][0], [w["cout"]], w["bias"][1])
        else:
            tensors[f"{name}.weight"] = (w["slope"][0], [w["n"]], w["slope"][1])
    meta["source"] = param_path.rsplit("/", 1)[-1]
    write_safetensors(out_path, tensors, meta)
    return meta


def main(argv):
    if len(argv) != 4:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        meta = convert(argv[1], argv[2], argv[3])
    except (ConvertError, OSError) as e:
        print(f"ncnn2safetensors: {e}", file=sys.stderr)
        return 1
    print(f"{argv[3]}: {meta}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
