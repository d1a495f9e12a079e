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

--device cuda (or cuda:N): the DataLoader has pin_memory=True and each batch's tensors are sent
with .to(device, non_blocking=True), as PyTorch users do; the warm-up is 12 * num_workers + 8
batches, and the timed interval starts and ends with torch.cuda.synchronize(), so copies still in
flight count. --gpu-step-ms X adds a synthetic training step on each batch: a chain of float32
matmuls calibrated to about X ms (as loader_bench.cpp's), starting from the sum of the batch's
tensors so that the GPU waits for the batch's copy. Each run then also times the step alone on a
batch already on the device ("step_alone_steps" in "step_alone_seconds"), and the JSON gives the
calibrated step ("step_n", "step_k", "step_ms"):
  python3 bench/pytorch_peer.py --workload tensor --num-workers 4 --seconds 2 --device cuda \
      --gpu-step-ms 4

--huge ORDER N (sequential or shuffled): one DataLoader over N int64 scalars, batch_size=256,
generator=torch.Generator().manual_seed(0); prints the time from constructing it to its first
batch and the process's peak resident memory, as {"seconds": ..., "peak_rss": ...}. Run each case
in a fresh process (peak memory is per process):
  python3 bench/pytorch_peer.py --huge shuffled 100000000 --num-workers 2
"""

import argparse
import json
import math
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


def warmup_batches(num_workers, device=None):
    # Enough for every worker to have delivered a batch and the prefetch queue to be running; with
    # a device, long enough for one-off costs (pinning, CUDA's caches) to be out of the timed part.
    if device is not None:
        return max(3, 2 * num_workers, 12 * num_workers + 8)
    return max(3, 2 * num_workers)


def to_device(batch, device):
    """The batch's tensors on `device`, sent as PyTorch users do."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [to_device(value, device) for value in batch]
    return batch


def tensors_of(batch):
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return [t for value in batch for t in tensors_of(value)]
    return []


def median_ms(device, fn):
    """Median of 5 synchronised runs of fn, after 2 unmeasured ones (as loader_bench.cpp)."""
    times = []
    for i in range(7):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        if i >= 2:
            times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


class GpuStep:
    """A synthetic training step, built as loader_bench.cpp's GpuStep: a chain of k float32
    matmuls of n x n on the device, starting from the sum of every tensor of the batch (so the GPU
    cannot begin before the batch's copy has landed). n is halved from 4096 until one matmul takes
    at most an eighth of the target; k fills the target, corrected once from the whole step
    measured on `sample`."""

    def __init__(self, device, target_ms, sample):
        n = 4096
        while True:
            self.a = torch.randn(n, n, device=device)
            self.b = torch.randn(n, n, device=device) / math.sqrt(n)
            one_ms = median_ms(device, lambda: torch.matmul(self.a, self.b))
            if one_ms <= target_ms / 8 or n <= 256:
                break
            n //= 2
        self.n = n
        self.zero = torch.zeros((), device=device)
        self.k = max(1, math.floor(target_ms / one_ms + 0.5))
        self.ms = median_ms(device, lambda: self(sample))
        self.k = max(1, math.floor(self.k * target_ms / self.ms + 0.5))
        self.ms = median_ms(device, lambda: self(sample))

    def __call__(self, batch):
        """Queues the step on the device; returns without waiting for it."""
        total = self.zero
        for t in tensors_of(batch):
            total = total + t.sum()
        x = self.a + total * 1e-9
        for _ in range(self.k):
            x = torch.matmul(x, self.b)


def device_batch(workload, device, image_root=None):
    """One batch of `workload`, collated in this process and sent to `device`."""
    dataset, batch_size, _ = make(workload, image_root)
    samples = [dataset[i] for i in range(batch_size)]
    batch = to_device(torch.utils.data.default_collate(samples), device)
    torch.cuda.synchronize(device)
    return batch


def step_alone(step, batch, device, batches, seconds):
    """(steps, seconds): a loop of steps on a batch already on the device, synchronised."""
    steps = batches if batches is not None else max(10, int(seconds * 1e3 / step.ms))
    for _ in range(3):
        step(batch)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step(batch)
    torch.cuda.synchronize(device)
    return steps, time.perf_counter() - start


def run_once(workload, num_workers, batches, seconds, start_method, image_root=None, device=None,
             step=None):
    dataset, batch_size, payload = make(workload, image_root)
    alone = None
    if step is not None:
        alone = step_alone(step, device_batch(workload, device, image_root), device, batches,
                           seconds)
    kwargs = {}
    if workload == "jpeg":
        kwargs["sampler"] = torch.utils.data.RandomSampler(dataset, replacement=True,
                                                           num_samples=ENDLESS)
    if num_workers > 0:
        kwargs["multiprocessing_context"] = start_method
    if device is not None:
        kwargs["pin_memory"] = True

    def next_batch(it):
        batch = next(it)
        if device is not None:
            batch = to_device(batch, device)
            if step is not None:
                step(batch)

    def synchronize():
        if device is not None:
            torch.cuda.synchronize(device)

    start = time.perf_counter()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        persistent_workers=False, **kwargs)
    it = iter(loader)
    next_batch(it)
    first_batch_s = time.perf_counter() - start
    for _ in range(warmup_batches(num_workers, device)):
        next_batch(it)

    count = 0
    synchronize()  # the warm-up's copies and steps are done
    start = time.perf_counter()
    if batches is not None:
        for _ in range(batches):
            next_batch(it)
        count = batches
    else:
        deadline = start + seconds
        while True:
            next_batch(it)
            count += 1
            if time.perf_counter() >= deadline:
                break
    synchronize()  # copies and steps still in flight count
    elapsed = time.perf_counter() - start
    del it  # shuts the workers down (not timed)
    del loader

    result = {
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
    if device is not None:
        result["device"] = str(device)
        result["device_name"] = torch.cuda.get_device_name(device)
        result["pin_memory"] = True
    if step is not None:
        result.update({
            "step_n": step.n,
            "step_k": step.k,
            "step_ms": step.ms,
            "step_alone_steps": alone[0],
            "step_alone_seconds": alone[1],
            "step_alone_ms": alone[1] * 1e3 / alone[0],
            "ms_per_batch": elapsed * 1e3 / count if count else 0.0,
        })
    return result


class IndexDataset(Dataset):
    """N int64 scalars: the cheapest samples, so the epoch's order is what costs."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return torch.tensor(index)


def peak_rss_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run_huge(order, n, num_workers):
    start = time.perf_counter()
    loader = DataLoader(IndexDataset(n), batch_size=256, shuffle=(order == "shuffled"),
                        num_workers=num_workers, generator=torch.Generator().manual_seed(0))
    next(iter(loader))
    seconds = time.perf_counter() - start
    return {"loader": "pytorch", "order": order, "n": n, "num_workers": num_workers,
            "seconds": seconds, "peak_rss": peak_rss_bytes()}


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
    parser.add_argument("--device", help="cuda or cuda:N: pin_memory=True and each batch sent "
                        "there with .to(device, non_blocking=True)")
    parser.add_argument("--gpu-step-ms", type=float, default=0.0,
                        help="with --device: a synthetic GPU step of about this many ms on each "
                        "batch, and the step alone (default 0: none)")
    parser.add_argument("--huge", nargs=2, metavar=("ORDER", "N"),
                        help="time to the first batch and peak memory of one epoch of N samples "
                        "in ORDER (sequential or shuffled)")
    args = parser.parse_args(argv)

    if args.huge:
        order, n = args.huge[0], int(args.huge[1])
        if order not in ("sequential", "shuffled") or n < 1:
            parser.error("--huge: expected sequential or shuffled and a positive count")
        print(json.dumps(run_huge(order, n, worker_counts(args.num_workers or ["0"])[0])),
              flush=True)
        return 0

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
    if args.gpu_step_ms < 0 or (args.gpu_step_ms > 0 and args.device is None):
        parser.error("--gpu-step-ms needs --device and a number of milliseconds >= 0")

    device = None
    if args.device is not None:
        if not args.device.startswith("cuda"):
            parser.error(f"--device {args.device}: expected cuda or cuda:N")
        if not torch.cuda.is_available():
            print(f"pytorch_peer.py: --device {args.device}: no CUDA device is available: this "
                  f"torch ({torch.__version__}) was built without CUDA, or no GPU is visible "
                  "(torch.cuda.is_available() is False). Run it on a machine with a GPU and a "
                  "CUDA-enabled torch, or leave --device out.", file=sys.stderr)
            return 2
        try:
            device = torch.device(args.device)
            torch.cuda.get_device_name(device)
        except (RuntimeError, AssertionError) as e:
            print(f"pytorch_peer.py: --device {args.device}: {e}", file=sys.stderr)
            return 2

    step = None
    if args.gpu_step_ms > 0:
        sample = device_batch(workloads[0], device, args.image_root)
        step = GpuStep(device, args.gpu_step_ms, sample)
        print(f"pytorch_peer.py: GPU step calibrated to {args.gpu_step_ms:g} ms: {step.k} x "
              f"matmul {step.n}x{step.n}, {step.ms:.2f} ms", file=sys.stderr)

    for workload in workloads:
        for num_workers in counts:
            for _ in range(max(1, args.repeat)):
                result = run_once(workload, num_workers, args.batches, args.seconds,
                                  args.start_method, args.image_root, device, step)
                print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
