"""The numbers of server/src/sdapi/inpaint.rs's crop-region test: A1111's inpaint area
"only masked" region (modules/masking.py get_crop_region_v2 with the padding, then
expand_crop_region to the processing size's aspect), restated here from A1111's
definitions on box masks. Run: python3 crop_region.py
"""
import numpy as np


def get_crop_region_v2(mask, pad):
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return None
    h, w = mask.shape
    x1, y1, x2, y2 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
    return (max(x1 - pad, 0), max(y1 - pad, 0), min(x2 + pad, w), min(y2 + pad, h)) if pad else (x1, y1, x2, y2)


def expand_crop_region(region, pw, ph, iw, ih):
    x1, y1, x2, y2 = region
    ratio_crop = (x2 - x1) / (y2 - y1)
    ratio_processing = pw / ph
    if ratio_crop > ratio_processing:
        diff = int((x2 - x1) / ratio_processing - (y2 - y1))
        y1 -= diff // 2
        y2 += diff - diff // 2
        if y2 >= ih:
            y1 -= y2 - ih
            y2 = ih
        if y1 < 0:
            y2 -= y1
            y1 = 0
        if y2 >= ih:
            y2 = ih
    else:
        diff = int((y2 - y1) * ratio_processing - (x2 - x1))
        x1 -= diff // 2
        x2 += diff - diff // 2
        if x2 >= iw:
            x1 -= x2 - iw
            x2 = iw
        if x1 < 0:
            x2 -= x1
            x1 = 0
        if x2 >= iw:
            x2 = iw
    return x1, y1, x2, y2


CASES = [
    ((512, 512), (200, 220, 300, 260), 32, (512, 512)),
    ((512, 512), (10, 10, 40, 30), 0, (512, 512)),
    ((640, 480), (600, 0, 640, 400), 16, (512, 512)),
    ((640, 480), (0, 470, 600, 480), 8, (768, 512)),
    ((300, 200), (100, 50, 101, 51), 0, (64, 96)),
    ((300, 200), (0, 0, 300, 200), 32, (512, 256)),
    ((256, 256), (250, 250, 256, 256), 4, (512, 384)),
]
for (w, h), (bx1, by1, bx2, by2), pad, (pw, ph) in CASES:
    mask = np.zeros((h, w), np.uint8)
    mask[by1:by2, bx1:bx2] = 255
    padded = get_crop_region_v2(mask, pad)
    print(((w, h), (bx1, by1, bx2, by2), pad, (pw, ph), padded, expand_crop_region(padded, pw, ph, w, h)))
