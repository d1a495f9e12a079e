#!/usr/bin/python3
"""PyTorch's own DataLoader on the workloads of ferry's loader benchmark (bench/loader_bench.cpp).

Prints one JSON object per measured run on stdout:
  {"loader": "pytorch", "workload": ..., "num_workers": ..., "batches": ..., "seconds": ...,
   "batches_per_s": ..., "mb_per_s": ..., "first_batch_s": ...}

Run it with Debian's python3-torch:
  /usr/bin/python3 bench/pytorch_peer.py --workload tiny --num-workers 1,2 --batches 2000

Workloads (the same as ferry's; MB = 10**6 bytes of batch payload):
  tiny         int64 scalars (torch.tensor(i)), batch_size=1: per-batch overhead, batches/s.
  tensor       a fresh clone of one stored float32 3x224x224 tensor plus an int label per sample,
               batch_size=64 (38.5 MB a batch): MB/s.
  tensor-view  as tensor, but the stored tensor itself is returned, not a clone.
  jpeg         torchvision's ImageFolder over --image-root with RandomResizedCrop(224),
               RandomHorizontalFlip, ToTensor, Normalize (PIL decoding), batch_size=32, files
               drawn with replacement: images/s (batches_per_s * 32).

Each configuration runs in a fresh DataLoader (persistent_workers=False). first_batch_s is the
time from constructing the DataLoader (and iter()) to the first batch; then a few warm-up batches
are read and `--batches` batches (or `--seconds` of them) are timed.
"""

import argparse
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

IMAGE_SHAPE = (3, 224, 224)
TENSOR_BATCH = 64
# Large enough that no run exhausts it; the default SequentialSampler is lazy (iter(range(n))).
ENDLESS = 10**9


class TinyDataset(Dataset):
    def __len__(self):
        return ENDLESS

    def __getitem__(self, index):
        return torch.tensor(index)  # int64, as ferry's int field


class TensorDataset(Dataset):
    def __init__(self, clone):
        self.image = torch.rand(IMAGE_SHAPE)
        self.clone = clone

    def __len__(self):
        return ENDLESS

    def __getitem__(self, index):
        image = self.image.clone() if self.clone else self.image
        return {"image": image, "label": index}


JPEG_BATCH = 32


def make(workload, image_root=None):
    """(dataset, batch_size, payload bytes per batch)."""
    if workload == "jpeg":
        import torchvision
        import torchvision.transforms as T
        transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                               T.Normalize(mean=[0.485, 0.456, 0.406],
                                           std=[0.229, 0.224, 0.225])])
        dataset = torchvision.datasets.ImageFolder(image_root, transform=transform)
        return dataset, JPEG_BATCH, JPEG_BATCH * (4 * 3 * 224 * 224 + 8)
    if workload == "tiny":
        return TinyDataset(), 1, 8
    image_bytes = 4 * IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2]
    payload = TENSOR_BATCH * (image_bytes + 8)
    return TensorDataset(clone=(workload == "tensor")), TENSOR_BATCH, payload


def warmup_batches(num_workers):
    # Enough for every worker to have delivered a batch and the prefetch queue to be running.
    return max(3, 2 * num_workers)


def run_once(workload, num_workers, batches, seconds, start_method, image_root=None):
    dataset, batch_size, payload = make(workload, image_root)
    kwargs = {}
    if workload == "jpeg":
        kwargs["sampler"] = torch.utils.data.RandomSampler(dataset, replacement=True,
                                                           num_samples=ENDLESS)
    if num_workers > 0:
        kwargs["multiprocessing_context"] = start_method
    start = time.perf_counter()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        persistent_workers=False, **kwargs)
    it = iter(loader)
    next(it)
    first_batch_s = time.perf_counter() - start
    for _ in range(warmup_batches(num_workers)):
        next(it)

    count = 0
    start = time.perf_counter()
    if batches is not None:
        for _ in range(batches):
            next(it)
        count = batches
    else:
        deadline = start + seconds
        while True:
            next(it)
            count += 1
            if time.perf_counter() >= deadline:
                break
    elapsed = time.perf_counter() - start
    del it  # shuts the workers down (not timed)
    del loader

    return {
        "loader": "pytorch",
        "workload": workload,
        "num_workers": num_workers,
        "batches": count,
        "seconds": elapsed,
        "batches_per_s": count / elapsed if elapsed > 0 else 0.0,
        "mb_per_s": count * payload / 1e6 / elapsed if elapsed > 0 else 0.0,
        "first_batch_s": first_batch_s,
        "start_method": start_method,
        "torch": torch.__version__,
    }


def worker_counts(values):
    counts = []
    for value in values:
        for part in value.split(","):
            if part.strip():
                counts.append(int(part))
    if any(c < 0 for c in counts):
        raise argparse.ArgumentTypeError("--num-workers must be >= 0")
    return counts or [0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", action="append",
                        help="tiny, tensor or tensor-view (repeatable or a comma list)")
    parser.add_argument("--num-workers", action="append", default=None,
                        help="worker counts (repeatable or a comma list); default 0")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--batches", type=int, help="batches to time after the warm-up")
    group.add_argument("--seconds", type=float, help="time batches for this long instead")
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration")
    parser.add_argument("--start-method", choices=["fork", "spawn"], default="fork")
    parser.add_argument("--image-root", help="the jpeg workload's ImageFolder")
    args = parser.parse_args(argv)

    workloads = []
    for value in args.workload or ["tiny"]:
        workloads += [w.strip() for w in value.split(",") if w.strip()]
    for w in workloads:
        if w not in ("tiny", "tensor", "tensor-view", "jpeg"):
            parser.error(f"--workload {w}: expected tiny, tensor, tensor-view or jpeg")
        if w == "jpeg" and not args.image_root:
            parser.error("--workload jpeg needs --image-root")
    counts = worker_counts(args.num_workers or ["0"])
    if args.batches is None and args.seconds is None:
        args.batches = 200
    if (args.batches is not None and args.batches < 1) or (args.seconds is not None and
                                                           args.seconds <= 0):
        parser.error("--batches must be >= 1 and --seconds > 0")

    for workload in workloads:
        for num_workers in counts:
            for _ in range(max(1, args.repeat)):
                result = run_once(workload, num_workers, args.batches, args.seconds,
                                  args.start_method, args.image_root)
                print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
