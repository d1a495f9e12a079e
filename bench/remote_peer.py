#!/usr/bin/env python3
"""The Python peer of bench/remote_bench.cpp: WebDataset's way of reading shards, in plain PyTorch.

Each DataLoader worker takes shards[worker::num_workers] and reads each one front to back from a
pipe, as WebDataset's `pipe:` URLs do: `curl` (signing S3 requests with --aws-sigv4) for a URL,
the file itself for a local path. `tarfile` splits the stream into members, samples are grouped
by key, and each JPEG is decoded by PIL into an HWC uint8 tensor, as ferry's `image` is. Prints
one line: images per second over the epoch and the shard bytes read per second.

Usage: remote_peer.py --workers W SHARD... (a path, or an http(s) URL; the AWS_* environment
variables sign it)
"""

import argparse
import io
import os
import subprocess
import sys
import tarfile
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


def open_shard(shard):
    if not shard.startswith("http"):
        return None, open(shard, "rb")
    command = ["curl", "-sS", "--fail", shard]
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        region = os.environ.get("AWS_REGION", "us-east-1")
        command += ["--aws-sigv4", f"aws:amz:{region}:s3",
                    "--user", f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}",
                    "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE)
    return proc, proc.stdout


class Shards(IterableDataset):
    def __init__(self, shards):
        self.shards = shards

    def __iter__(self):
        info = get_worker_info()
        mine = self.shards[info.id::info.num_workers] if info else self.shards
        for shard in mine:
            proc, stream = open_shard(shard)
            key, sample = None, {}
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    base = os.path.basename(member.name)
                    k = os.path.join(os.path.dirname(member.name), base.split(".", 1)[0])
                    ext = base.split(".", 1)[1].lower()
                    if key is not None and k != key:
                        yield self.decode(sample)
                        sample = {}
                    key = k
                    sample[ext] = tar.extractfile(member).read()
                if sample:
                    yield self.decode(sample)
            if proc is not None and proc.wait() != 0:
                raise RuntimeError(f"curl failed for {shard}")

    @staticmethod
    def decode(sample):
        image = np.asarray(Image.open(io.BytesIO(sample["jpg"])).convert("RGB"))
        return torch.from_numpy(image.copy()), int(sample["cls"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("shards", nargs="+")
    a = p.parse_args()
    torch.set_num_threads(1)
    loader = DataLoader(Shards(a.shards), batch_size=a.batch, num_workers=a.workers)
    start = time.perf_counter()
    images = 0
    for images_batch, _ in loader:
        images += images_batch.shape[0]
    seconds = time.perf_counter() - start
    total = 0
    for s in a.shards:
        total += os.path.getsize(s) if not s.startswith("http") else 0
    print(f"{images / seconds:.1f} {images} {seconds:.4f}")


if __name__ == "__main__":
    sys.exit(main())
