#!/usr/bin/env python3
"""The peer of `ferry preprocess` in the preprocess benchmark: what a Python user writes today.

torchvision's ImageFolder listing, a multiprocessing.Pool of WORKERS processes that open each
image with Pillow (convert("RGB")), run torchvision's Resize(256) and CenterCrop(224), re-encode
it as JPEG at quality 90 and sum its pixels per channel (for the statistics), and the main
process writing WebDataset tar shards of SHARD samples (<key>.cls, <key>.jpg, <key>.json) with
tarfile, in input order, as ferry does.

Usage: preprocess_peer.py ROOT OUT WORKERS SHARD   (prints a JSON line with images and seconds)
"""

import io
import json
import multiprocessing
import os
import sys
import tarfile
import time

import numpy as np
from PIL import Image
from torchvision import transforms
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

PIPELINE = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])


def process(item):
    index, (path, label) = item
    with open(path, "rb") as f:
        raw = f.read()
    image = Image.open(io.BytesIO(raw)).convert("RGB")
    width, height = image.size
    out = PIPELINE(image)
    pixels = np.asarray(out, dtype=np.int64)
    sums = pixels.sum(axis=(0, 1)).tolist()
    squares = (pixels * pixels).sum(axis=(0, 1)).tolist()
    buffer = io.BytesIO()
    out.save(buffer, format="JPEG", quality=90)
    meta = {"path": os.path.relpath(path, ROOT), "label": label, "width": out.size[0],
            "height": out.size[1], "original_width": width, "original_height": height,
            "original_bytes": len(raw)}
    return index, label, buffer.getvalue(), json.dumps(meta).encode(), sums, squares


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def main():
    global ROOT
    ROOT, out, workers, shard = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    _, class_to_idx = find_classes(ROOT)
    items = list(enumerate(make_dataset(ROOT, class_to_idx, extensions=IMG_EXTENSIONS)))
    sums = np.zeros(3, dtype=np.float64)
    tar = None
    with multiprocessing.Pool(workers) as pool:
        for index, label, jpeg, meta, s, _ in pool.imap(process, items, chunksize=8):
            if index % shard == 0:
                if tar is not None:
                    tar.close()
                tar = tarfile.open(os.path.join(out, "peer-%06d.tar" % (index // shard)), "w")
            key = "%06d" % index
            add(tar, key + ".cls", str(label).encode())
            add(tar, key + ".jpg", jpeg)
            add(tar, key + ".json", meta)
            sums += s
    if tar is not None:
        tar.close()
    seconds = time.perf_counter() - start
    print(json.dumps({"images": len(items), "seconds": seconds}))


if __name__ == "__main__":
    main()
