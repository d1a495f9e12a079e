#!/usr/bin/python3
"""The Python peers of build/bench/ferry_token_bench, on the same files: nanoGPT's get_batch loop
and PyTorch's DataLoader over a Dataset that reads Megatron-LM's GPT windows from the same
memory-mapped .bin, in the same order (the indices ferry wrote to its cache folder, which are
Megatron's). Prints one JSON object: tokens per second delivered to the loop.

  token_peer.py --prefix P --cache DIR --hash H --seq-length L --batch B --workers W --seconds S
                [--nanogpt]

nanoGPT's loop (train.py get_batch): a fresh np.memmap of the .bin per batch, B random offsets
from torch.randint, x and y as int64 stacks. The DataLoader's Dataset does what Megatron-LM's
GPTDataset.__getitem__ does: the window's runs sliced from the memmap, concatenated, as int64
tokens and labels.
"""
import argparse
import glob
import json
import os
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


def index_files(cache, digest):
    def one(kind):
        found = glob.glob(os.path.join(cache, f"{digest}-GPTDataset-train-{kind}_index.npy"))
        assert len(found) == 1, f"no {kind} index in {cache}"
        return np.load(found[0], mmap_mode="r")
    return one("document"), one("sample"), one("shuffle")


def read_idx(prefix):
    """Megatron's .idx: sequence lengths and byte pointers (megatron/core/datasets/
    indexed_dataset.py), as np.frombuffer views of the file."""
    with open(prefix + ".idx", "rb") as f:
        data = f.read()
    assert data[:9] == b"MMIDIDX\x00\x00"
    n = int(np.frombuffer(data, np.uint64, 1, 18)[0])
    lengths = np.frombuffer(data, np.int32, n, 34)
    pointers = np.frombuffer(data, np.int64, n, 34 + 4 * n)
    return lengths, pointers


class MegatronWindows(Dataset):
    def __init__(self, prefix, cache, digest, seq_length):
        self.prefix, self.seq_length = prefix, seq_length
        self.document, self.sample, self.shuffle = index_files(cache, digest)
        self.lengths, self.pointers = read_idx(prefix)
        self.bin = None

    def __len__(self):
        return len(self.shuffle)

    def __getitem__(self, k):
        if self.bin is None:  # per worker, after the fork
            self.bin = np.memmap(self.prefix + ".bin", dtype=np.uint16, mode="r")
        i = int(self.shuffle[k])
        (b, bo), (e, eo) = self.sample[i], self.sample[i + 1]
        parts = []
        for p in range(b, e + 1):
            d = int(self.document[p])
            start = int(self.pointers[d]) // 2
            lo = bo if p == b else 0
            hi = eo + 1 if p == e else int(self.lengths[d])
            parts.append(self.bin[start + lo:start + hi])
        text = np.concatenate(parts).astype(np.int64)
        return {"tokens": torch.from_numpy(text[:-1]), "labels": torch.from_numpy(text[1:])}


def time_loop(batches, seconds, tokens_per_batch):
    it = iter(batches)
    next(it)  # first batch (workers start) not timed
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        try:
            next(it)
        except StopIteration:
            it = iter(batches)
            continue
        n += 1
    return n * tokens_per_batch / (time.perf_counter() - start)


def nanogpt(prefix, seq_length, batch, seconds):
    def get_batch():
        data = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - seq_length, (batch,))
        x = torch.stack([torch.from_numpy((data[i:i + seq_length]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + seq_length]).astype(np.int64))
                         for i in ix])
        return x, y

    class Forever:
        def __iter__(self):
            while True:
                yield get_batch()

    return time_loop(Forever(), seconds, batch * seq_length)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefix", required=True)
    p.add_argument("--cache", required=True)
    p.add_argument("--hash", required=True)
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--nanogpt", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    out = {}
    dataset = MegatronWindows(a.prefix, a.cache, a.hash, a.seq_length)
    loader = DataLoader(dataset, batch_size=a.batch, num_workers=a.workers,
                        persistent_workers=a.workers > 0)
    out["dataloader"] = time_loop(loader, a.seconds, a.batch * a.seq_length)
    if a.nanogpt:
        out["nanogpt"] = nanogpt(a.prefix, a.seq_length, a.batch, a.seconds)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
