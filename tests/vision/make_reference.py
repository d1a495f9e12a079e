#!/usr/bin/python3
"""Writes test images and torchvision's outputs on them, the reference that ferry's C++ image
decoding and transforms are compared against.

Run with Debian's python3 (torch 1.13, torchvision 0.14.1, Pillow 9.4, numpy; no cv2):

    /usr/bin/python3 tests/vision/make_reference.py OUT_DIR [--all]

Deterministic: every image comes from a seeded numpy generator, every random parameter from
torch.manual_seed(seed). Takes a few seconds.

Output layout
-------------
OUT_DIR/images/<name>   the test images (JPEG q90 / PNG; see IMAGES below):
    rgb_500x375.jpg rgb_375x500.jpg rgb_257x131.jpg rgb_31x17.jpg rgb_500x375.png
    rgb_257x131.png gray_320x240.png (L) gray_320x240.jpg (L) rgba_300x200.png (RGBA, alpha a
    gradient) palette_120x80.png (P) rgb16_200x150.png (16-bit RGB, hand-written PNG)
    gray16_200x150.png (16-bit gray, hand-written PNG) cmyk_160x120.jpg (CMYK with K != 0,
    Adobe-inverted as Pillow writes it)

OUT_DIR/manifest.txt    one line per reference case, space-separated:
    <case> <image_file_name> <pipeline> <dtype> <C> <H> <W> ref/<case>.bin
  case   = <image file name with "." replaced by "_">__<pipeline>, e.g.
           rgb_500x375_jpg__imagenet_eval (the extension stays in: rgb_500x375.jpg and
           rgb_500x375.png would otherwise share a name)
  dtype  = u8 (uint8) or f32 (float32, little-endian)
  C H W  = shape of the output tensor
OUT_DIR/ref/<case>.bin  the output tensor, raw bytes, C-contiguous in C,H,W order, no header.

Each image is decoded as torchvision's ImageFolder default loader does,
Image.open(path).convert("RGB"), except:
  * gray16_200x150.png: Pillow's convert("RGB") of a 16-bit grayscale image CLIPS each value to
    255, while ferry keeps the high byte; the reference input for it is
    Image.fromarray((a16 >> 8).astype(uint8), "L").convert("RGB") with a16 the written samples.
  * rgb16_200x150.png: Pillow decodes 16-bit RGB PNGs to 8-bit RGB by keeping the high byte
    (asserted below).
  * the "gray" pipeline decodes with .convert("L") (for gray16: the high-byte L image above).
Then the pipeline runs on the PIL image (torchvision.transforms T, .functional F; default
bilinear interpolation, which on PIL images is always antialiased):
  decode               T.PILToTensor()                                                  u8
  imagenet_eval        T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                       T.Normalize([0.485,0.456,0.406], [0.229,0.224,0.225])           f32
  resize_short_100     T.Resize(100), PILToTensor                                       u8
  resize_exact_120x90  T.Resize((90, 120)) (height 90, width 120), PILToTensor          u8
  resize_up_64         T.Resize(64), PILToTensor                                        u8
  resize_max_size      T.Resize(100, max_size=120), PILToTensor                         u8
  crop_fixed           F.crop(top=5, left=7, height=min(100,H-5), width=min(120,W-7))   u8
  center_crop_pad      T.CenterCrop((H+10, W+7)) (zero padding), PILToTensor            u8
  center_crop_odd      T.CenterCrop((H//2+1, W//3)), PILToTensor                        u8
  pad_crop             F.pad(4) (constant 0), F.crop(top=3, left=6, height=H-2, width=W-5) u8
  hflip / vflip        F.hflip / F.vflip, PILToTensor                                   u8
  to_tensor            T.ToTensor()                                                     f32
  gray                 decode with convert("L"), PILToTensor -> [1,H,W]                 u8
  brightness_1.4 contrast_0.6 saturation_1.5 hue_0.1 hue_-0.25
                       F.adjust_brightness/contrast/saturation/hue(img, factor), PILToTensor u8
(H, W: the decoded image's size.)

Which pipelines run on which image: see selected(). Always: resize_up_64 only on rgb_31x17.jpg
and rgb_257x131.*; the colour adjustments only on the rgb_*.jpg / rgb_*.png images; gray only on
rgb_500x375.jpg, gray_320x240.*, rgba_300x200.png, gray16_200x150.png. By default, to keep
OUT_DIR near 15 MB, also: the pipelines whose output is as large as the image and whose
per-pixel result depends neither on the image's size nor on its format (to_tensor, hflip,
vflip, center_crop_pad, pad_crop, the colour adjustments) run only on images of at most 40000
pixels (rgb_257x131.*, rgb_31x17.jpg, palette, rgb16, gray16, cmyk); to_tensor only on
rgb_257x131.png, rgb_31x17.jpg, palette_120x80.png, cmyk_160x120.jpg; imagenet_eval (602 KB of
f32 each) only on rgb_500x375.*, rgb_375x500.jpg, rgb_257x131.jpg, rgb_31x17.jpg,
gray_320x240.png, cmyk_160x120.jpg. With --all every pipeline runs on every image, apart from
the "always" restrictions (~47 MB).

Random parameters (one line each, space-separated, floats written with repr()):
OUT_DIR/rrc_boxes.txt    seed height width scale0 scale1 ratio0 ratio1 i j h w
    torch.manual_seed(seed); T.RandomResizedCrop.get_params(torch.empty(3,height,width),
    (scale0,scale1), (ratio0,ratio1)); seeds 0..299; (height, width) in (375,500) (500,375)
    (100,1000) (1000,100) (50,50) (224,224); (scale, ratio) in ((0.08,1),(3/4,4/3))
    ((0.5,0.9),(0.5,2)) ((0.9,1),(3,4)) ((0.9,1),(0.25,4)).
OUT_DIR/random_crop.txt  seed height width th tw i j
    torch.manual_seed(seed); T.RandomCrop.get_params(torch.empty(3,height,width), (th,tw));
    seeds 0..99; (height, width, th, tw) in (375,500,224,224) (50,60,50,60) (100,100,1,1).
OUT_DIR/flips.txt        seed p flipped
    torch.manual_seed(seed); flipped = int(torch.rand(1) < p) (RandomHorizontalFlip.forward);
    seeds 0..99; p in 0.5 0.1 0.9.
OUT_DIR/color_jitter.txt seed fn_idx0 fn_idx1 fn_idx2 fn_idx3 b c s h
    torch.manual_seed(seed); T.ColorJitter.get_params((0.6,1.4), (0.6,1.4), (0.6,1.4),
    (-0.1,0.1)), i.e. ColorJitter(0.4, 0.4, 0.4, 0.1); seeds 0..99.
"""
import math
import os
import struct
import sys
import zlib

import numpy as np
import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image

# ----------------------------------------------------------------------------------------------
# Images
# ----------------------------------------------------------------------------------------------


def photo(w, h, seed, channels=3):
    """Photo-like uint8 array [h, w, channels]: a smooth 2-D colour gradient, sharp-edged filled
    rectangles and discs, mild Gaussian noise (sigma 6)."""
    rng = np.random.default_rng(seed)
    v, u = np.mgrid[0:h, 0:w].astype(np.float64)
    u /= max(w - 1, 1)
    v /= max(h - 1, 1)
    corners = rng.uniform(20, 235, size=(4, channels))
    img = ((1 - u)[..., None] * (1 - v)[..., None] * corners[0] +
           u[..., None] * (1 - v)[..., None] * corners[1] +
           (1 - u)[..., None] * v[..., None] * corners[2] +
           u[..., None] * v[..., None] * corners[3])
    # a gentle wave so the gradient is not bilinear (which resizing would reproduce trivially)
    img += 18 * np.sin(2 * math.pi * (u * rng.uniform(0.5, 2) + v * rng.uniform(0.5, 2)))[..., None]
    yy, xx = np.mgrid[0:h, 0:w]
    for _ in range(int(rng.integers(5, 10))):
        colour = rng.uniform(0, 255, size=channels)
        if rng.random() < 0.5:
            x0, y0 = rng.uniform(-0.1, 0.9) * w, rng.uniform(-0.1, 0.9) * h
            rw, rh = rng.uniform(0.08, 0.45) * w, rng.uniform(0.08, 0.45) * h
            mask = (xx >= x0) & (xx < x0 + rw) & (yy >= y0) & (yy < y0 + rh)
        else:
            cx, cy = rng.uniform(0, w), rng.uniform(0, h)
            r = rng.uniform(0.05, 0.3) * min(w, h) + 1
            mask = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
        img[mask] = colour
    img += rng.normal(0, 6, size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def png_chunk(tag, data):
    return (struct.pack(">I", len(data)) + tag + data +
            struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))


def write_png16(path, a16):
    """Hand-written 16-bit PNG (Pillow cannot write 16-bit RGB): colour type 2 for [h,w,3],
    0 for [h,w]; one IDAT, filter byte 0 on every row, big-endian samples."""
    h, w = a16.shape[:2]
    colour_type = 2 if a16.ndim == 3 else 0
    rows = a16.astype(">u2").reshape(h, -1)
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(h))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, colour_type, 0, 0, 0)))
        f.write(png_chunk(b"IDAT", zlib.compress(raw, 6)))
        f.write(png_chunk(b"IEND", b""))


def to16(a8, seed):
    """Full 16-bit samples: 8-bit content * 257 plus noise in [-40, 40], clipped; the high byte
    is therefore sometimes a8 +- 1 (so keeping the high byte differs from rounding v/257)."""
    rng = np.random.default_rng(seed)
    a = a8.astype(np.int64) * 257 + rng.integers(-40, 41, size=a8.shape)
    return np.clip(a, 0, 65535).astype(np.uint16)


def make_images(img_dir):
    """Writes the images; returns {file name: reference RGB PIL image or None (use Pillow)} for
    the special 16-bit gray case, and checks Pillow's 16-bit semantics."""
    os.makedirs(img_dir, exist_ok=True)
    p = lambda name: os.path.join(img_dir, name)
    special = {}

    Image.fromarray(photo(500, 375, 101)).save(p("rgb_500x375.jpg"), quality=90)
    Image.fromarray(photo(375, 500, 102)).save(p("rgb_375x500.jpg"), quality=90)
    Image.fromarray(photo(257, 131, 103)).save(p("rgb_257x131.jpg"), quality=90)
    Image.fromarray(photo(31, 17, 104)).save(p("rgb_31x17.jpg"), quality=90)
    Image.fromarray(photo(500, 375, 105)).save(p("rgb_500x375.png"))
    Image.fromarray(photo(257, 131, 106)).save(p("rgb_257x131.png"))
    Image.fromarray(photo(320, 240, 107, channels=1)[..., 0], "L").save(p("gray_320x240.png"))
    Image.fromarray(photo(320, 240, 108, channels=1)[..., 0], "L").save(p("gray_320x240.jpg"),
                                                                        quality=90)
    rgb = photo(300, 200, 109)
    v, u = np.mgrid[0:200, 0:300]
    alpha = np.clip(np.rint(255 * (u / 299 * 0.7 + v / 199 * 0.3)), 0, 255).astype(np.uint8)
    Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(p("rgba_300x200.png"))
    Image.fromarray(photo(120, 80, 110)).convert("P", palette=Image.ADAPTIVE).save(
        p("palette_120x80.png"))

    rgb16 = to16(photo(200, 150, 111), 211)
    write_png16(p("rgb16_200x150.png"), rgb16)
    with Image.open(p("rgb16_200x150.png")) as im:
        # Pillow 9.4 reads 16-bit RGB PNGs as mode RGB keeping the high byte of each sample.
        assert im.mode == "RGB", im.mode
        assert np.array_equal(np.asarray(im.convert("RGB")), (rgb16 >> 8).astype(np.uint8))

    gray16 = to16(photo(200, 150, 112, channels=1)[..., 0], 212)
    write_png16(p("gray16_200x150.png"), gray16)
    with Image.open(p("gray16_200x150.png")) as im:
        # Pillow reads it as a 32-bit integer image ("I") holding the exact 16-bit values...
        assert np.array_equal(np.asarray(im).astype(np.int64), gray16.astype(np.int64)), im.mode
        # ...and its convert("RGB") clips each value to 255 (almost all white). ferry keeps the
        # high byte instead, so the reference input is the high byte as an L image.
        assert np.array_equal(np.asarray(im.convert("RGB"))[..., 0], np.minimum(gray16, 255))
    special["gray16_200x150.png"] = Image.fromarray((gray16 >> 8).astype(np.uint8), "L")

    # Pillow's convert("CMYK") does no undercolour removal (C,M,Y = 255-R,G,B; K = 0), which
    # would leave the K channel untested; move half of min(C,M,Y) into K.
    cmyk = np.asarray(Image.fromarray(photo(160, 120, 113)).convert("CMYK")).astype(np.int32)
    k = cmyk[..., :3].min(axis=-1, keepdims=True) // 2
    cmyk = np.concatenate([cmyk[..., :3] - k, k], axis=-1).astype(np.uint8)
    # Pillow writes CMYK JPEGs Adobe-inverted (rawmode CMYK;I, with an Adobe APP14 marker,
    # transform 0) and reads every CMYK JPEG as inverted; its convert("RGB") is then, per
    # channel, nk = 255 - K; R = clip(nk - MULDIV255(C, nk)), MULDIV255(a, b) = (t + (t >> 8))
    # >> 8 with t = a * b + 128.
    Image.fromarray(cmyk, "CMYK").save(p("cmyk_160x120.jpg"), quality=90)
    return special


IMAGES = ["rgb_500x375.jpg", "rgb_375x500.jpg", "rgb_257x131.jpg", "rgb_31x17.jpg",
          "rgb_500x375.png", "rgb_257x131.png", "gray_320x240.png", "gray_320x240.jpg",
          "rgba_300x200.png", "palette_120x80.png", "rgb16_200x150.png", "gray16_200x150.png",
          "cmyk_160x120.jpg"]

# ----------------------------------------------------------------------------------------------
# Pipelines
# ----------------------------------------------------------------------------------------------

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def pipelines():
    """name -> (dtype, function of a PIL RGB (or L for gray) image returning a CHW tensor)."""
    pil = T.PILToTensor()

    def size(img):  # (H, W)
        return img.height, img.width

    def crop_fixed(img):
        h, w = size(img)
        return pil(F.crop(img, 5, 7, min(100, h - 5), min(120, w - 7)))

    def center_crop_pad(img):
        h, w = size(img)
        return pil(T.CenterCrop((h + 10, w + 7))(img))

    def center_crop_odd(img):
        h, w = size(img)
        return pil(T.CenterCrop((h // 2 + 1, w // 3))(img))

    def pad_crop(img):
        h, w = size(img)
        return pil(F.crop(F.pad(img, 4), 3, 6, h - 2, w - 5))

    imagenet = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                          T.Normalize(mean=MEAN, std=STD)])
    return {
        "decode": ("u8", pil),
        "imagenet_eval": ("f32", imagenet),
        "resize_short_100": ("u8", T.Compose([T.Resize(100), pil])),
        "resize_exact_120x90": ("u8", T.Compose([T.Resize((90, 120)), pil])),
        "resize_up_64": ("u8", T.Compose([T.Resize(64), pil])),
        "resize_max_size": ("u8", T.Compose([T.Resize(100, max_size=120), pil])),
        "crop_fixed": ("u8", crop_fixed),
        "center_crop_pad": ("u8", center_crop_pad),
        "center_crop_odd": ("u8", center_crop_odd),
        "pad_crop": ("u8", pad_crop),
        "hflip": ("u8", lambda img: pil(F.hflip(img))),
        "vflip": ("u8", lambda img: pil(F.vflip(img))),
        "to_tensor": ("f32", T.ToTensor()),
        "gray": ("u8", pil),  # the input is decoded with convert("L")
        "brightness_1.4": ("u8", lambda img: pil(F.adjust_brightness(img, 1.4))),
        "contrast_0.6": ("u8", lambda img: pil(F.adjust_contrast(img, 0.6))),
        "saturation_1.5": ("u8", lambda img: pil(F.adjust_saturation(img, 1.5))),
        "hue_0.1": ("u8", lambda img: pil(F.adjust_hue(img, 0.1))),
        "hue_-0.25": ("u8", lambda img: pil(F.adjust_hue(img, -0.25))),
    }


COLOUR = {"brightness_1.4", "contrast_0.6", "saturation_1.5", "hue_0.1", "hue_-0.25"}
# Pipelines whose output is as large as the image and whose per-pixel result does not depend on
# the image's size or source format (after decoding, every image is RGB).
FULL_RES = COLOUR | {"to_tensor", "hflip", "vflip", "center_crop_pad", "pad_crop"}
SMALL_PIXELS = 40000  # FULL_RES pipelines run only on images of at most this many pixels
TO_TENSOR_IMAGES = {"rgb_257x131.png", "rgb_31x17.jpg", "palette_120x80.png", "cmyk_160x120.jpg"}
IMAGENET_IMAGES = {"rgb_500x375.jpg", "rgb_375x500.jpg", "rgb_500x375.png", "rgb_257x131.jpg",
                   "rgb_31x17.jpg", "gray_320x240.png", "cmyk_160x120.jpg"}
GRAY_IMAGES = {"rgb_500x375.jpg", "gray_320x240.png", "gray_320x240.jpg", "rgba_300x200.png",
               "gray16_200x150.png"}


def selected(name, pipeline, pixels, run_all):
    """Whether pipeline runs on image name (of the given number of pixels)."""
    if pipeline == "resize_up_64":
        return name in ("rgb_31x17.jpg", "rgb_257x131.jpg", "rgb_257x131.png")
    if pipeline in COLOUR and not (name.startswith("rgb_") and name.endswith((".jpg", ".png"))):
        return False
    if pipeline == "gray":
        return name in GRAY_IMAGES
    if run_all:
        return True
    # The default keeps OUT_DIR near 15 MB.
    if pipeline in FULL_RES and pixels > SMALL_PIXELS:
        return False
    if pipeline == "to_tensor":
        return name in TO_TENSOR_IMAGES
    if pipeline == "imagenet_eval":
        return name in IMAGENET_IMAGES
    return True


def case_name(name, pipeline):
    return f"{name.replace('.', '_')}__{pipeline}"


def write_refs(out_dir, special, run_all):
    img_dir = os.path.join(out_dir, "images")
    ref_dir = os.path.join(out_dir, "ref")
    os.makedirs(ref_dir, exist_ok=True)
    pipes = pipelines()
    lines = []
    for name in IMAGES:
        path = os.path.join(img_dir, name)
        if name in special:
            l_img = special[name]
            rgb_img = l_img.convert("RGB")
        else:
            with Image.open(path) as im:
                rgb_img = im.convert("RGB")
            l_img = None
        for pipeline, (dtype, fn) in pipes.items():
            if not selected(name, pipeline, rgb_img.width * rgb_img.height, run_all):
                continue
            if pipeline == "gray":
                if l_img is None:
                    with Image.open(path) as im:
                        l_img = im.convert("L")
                out = fn(l_img)
            else:
                out = fn(rgb_img)
            arr = out.contiguous().numpy()
            assert arr.ndim == 3, (name, pipeline, arr.shape)
            arr = np.ascontiguousarray(arr, dtype="<f4" if dtype == "f32" else np.uint8)
            assert out.dtype == (torch.float32 if dtype == "f32" else torch.uint8)
            case = case_name(name, pipeline)
            rel = f"ref/{case}.bin"
            with open(os.path.join(out_dir, rel), "wb") as f:
                f.write(arr.tobytes())
            c, h, w = arr.shape
            lines.append(f"{case} {name} {pipeline} {dtype} {c} {h} {w} {rel}")
    with open(os.path.join(out_dir, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return len(lines)


# ----------------------------------------------------------------------------------------------
# Random parameters
# ----------------------------------------------------------------------------------------------


def rrc_fallback(height, width, scale, ratio, seed):
    """Replays RandomResizedCrop.get_params's ten attempts. Returns None if one succeeded, else
    which central-crop fallback branch it takes: "narrow" (w = width), "wide" (h = height) or
    "whole" (the whole image)."""
    torch.manual_seed(seed)
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            return None
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        return "narrow"
    if in_ratio > max(ratio):
        return "wide"
    return "whole"


def write_random_params(out_dir):
    lines, fallbacks = [], {}
    sizes = [(375, 500), (500, 375), (100, 1000), (1000, 100), (50, 50), (224, 224)]
    # The third setting makes all ten attempts fail on every size here (central-crop fallback,
    # "narrow"/"wide" branches); the fourth often fails on the square sizes, whose aspect ratio
    # is inside the ratio range, so it exercises the "whole image" fallback branch as well.
    settings = [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 0.9), (0.5, 2.0)), ((0.9, 1.0), (3.0, 4.0)),
                ((0.9, 1.0), (0.25, 4.0))]
    for seed in range(300):
        for height, width in sizes:
            for scale, ratio in settings:
                torch.manual_seed(seed)
                i, j, h, w = T.RandomResizedCrop.get_params(torch.empty(3, height, width),
                                                            scale, ratio)
                branch = rrc_fallback(height, width, scale, ratio, seed)
                if branch is not None:
                    fallbacks[branch] = fallbacks.get(branch, 0) + 1
                lines.append(" ".join([str(seed), str(height), str(width)] +
                                      [repr(float(x)) for x in scale + ratio] +
                                      [str(int(x)) for x in (i, j, h, w)]))
    with open(os.path.join(out_dir, "rrc_boxes.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"rrc_boxes.txt: {len(lines)} lines, {sum(fallbacks.values())} used the central-crop "
          f"fallback {dict(sorted(fallbacks.items()))}", file=sys.stderr)
    assert len(fallbacks) == 3, fallbacks  # every fallback branch is exercised

    lines = []
    for seed in range(100):
        for height, width, th, tw in [(375, 500, 224, 224), (50, 60, 50, 60), (100, 100, 1, 1)]:
            torch.manual_seed(seed)
            i, j, th2, tw2 = T.RandomCrop.get_params(torch.empty(3, height, width), (th, tw))
            assert (th2, tw2) == (th, tw)
            lines.append(f"{seed} {height} {width} {th} {tw} {int(i)} {int(j)}")
    with open(os.path.join(out_dir, "random_crop.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")

    lines = []
    for seed in range(100):
        for p in [0.5, 0.1, 0.9]:
            torch.manual_seed(seed)
            flipped = bool(torch.rand(1) < p)  # RandomHorizontalFlip.forward
            lines.append(f"{seed} {p!r} {int(flipped)}")
    with open(os.path.join(out_dir, "flips.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")

    lines = []
    for seed in range(100):
        torch.manual_seed(seed)
        fn_idx, b, c, s, h = T.ColorJitter.get_params((0.6, 1.4), (0.6, 1.4), (0.6, 1.4),
                                                      (-0.1, 0.1))
        lines.append(" ".join([str(seed)] + [str(int(k)) for k in fn_idx] +
                              [repr(float(x)) for x in (b, c, s, h)]))
    with open(os.path.join(out_dir, "color_jitter.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    args = [a for a in sys.argv[1:] if a != "--all"]
    if len(args) != 1:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR [--all]")
    out_dir = args[0]
    run_all = "--all" in sys.argv[1:]
    torch.set_num_threads(1)
    os.makedirs(out_dir, exist_ok=True)
    special = make_images(os.path.join(out_dir, "images"))
    n_cases = write_refs(out_dir, special, run_all)
    write_random_params(out_dir)

    n_files, total = 0, 0
    for root, _, files in os.walk(out_dir):
        for fn in files:
            n_files += 1
            total += os.path.getsize(os.path.join(root, fn))
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"Pillow {Image.__version__}: {n_cases} cases, {n_files} files, {total} bytes "
          f"in {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
