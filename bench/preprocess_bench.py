#!/usr/bin/env python3
"""`ferry preprocess` against a Python script with torchvision, Pillow and multiprocessing.Pool.

Both turn the same generated photos (`ferry sample-data`, 500x375 JPEGs) into WebDataset shards:
Resize(256), CenterCrop(224), JPEG quality 90, per-channel pixel sums, shards of 64 samples, with
the same number of worker processes. ferry runs twice: as configured by default (a JPEG may be
decoded at M/8 scale straight into the resize, `reduced_decode: true`) and bit-exact with
torchvision's resampling (`reduced_decode: false`). Rates are images per second of whole
processes (start to exit); the peer's rate without its interpreter start and imports is shown
too, and the ratio uses it (the peer's best case). Then the resume cost: a job killed with half
its shards recorded, run again, against the full job.

Usage: preprocess_bench.py [--ferry build/bin/ferry] [--images 1024] [--workers 1,2]
                           [--repeat 3] [--dir /tmp/ferry_preprocess_bench]
It reports; it never fails on a number.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def job_file(folder, data, out, workers, reduced, shard):
    path = os.path.join(folder, f"job-{workers}-{int(reduced)}.yaml")
    with open(path, "w") as f:
        f.write(f"input: {{image_folder: {{root: '{data}'}}}}\n"
                f"transforms:\n"
                f"  - resize: {{size: 256, reduced_decode: {str(reduced).lower()}}}\n"
                f"  - center_crop: {{size: 224}}\n"
                f"output: {{path: '{out}', shard_samples: {shard}, quality: 90}}\n"
                f"workers: {workers}\n")
    return path


def timed(command, env=None):
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    return result, seconds


def run_ferry(ferry, job, out, env=None, fresh=True):
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
    result, seconds = timed([ferry, "preprocess", job], env)
    return result, seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ferry", default=os.path.join(HERE, "..", "build", "bin", "ferry"))
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shard", type=int, default=64)
    parser.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                      "ferry_preprocess_bench"))
    args = parser.parse_args()
    ferry = os.path.abspath(args.ferry)
    os.makedirs(args.dir, exist_ok=True)
    data = os.path.join(args.dir, "photos")
    per_class = (args.images + 3) // 4
    subprocess.run([ferry, "sample-data", data, "--classes", "4", "--per-class", str(per_class)],
                   check=True, capture_output=True)
    images = 4 * per_class
    out = os.path.join(args.dir, "out")
    peer_out = os.path.join(args.dir, "peer-out")
    python = sys.executable
    rows = []
    for workers in [int(w) for w in args.workers.split(",")]:
        fast = job_file(args.dir, data, out, workers, True, args.shard)
        exact = job_file(args.dir, data, out, workers, False, args.shard)
        times = {"ferry": [], "ferry-exact": [], "peer": [], "peer-inner": []}
        for r in range(args.repeat):
            print(f"workers {workers}, run {r + 1}/{args.repeat}", file=sys.stderr)
            for name, job in (("ferry", fast), ("ferry-exact", exact)):
                result, seconds = run_ferry(ferry, job, out)
                if result.returncode != 0:
                    sys.exit(f"ferry preprocess failed:\n{result.stderr}")
                times[name].append(seconds)
            shutil.rmtree(peer_out, ignore_errors=True)
            result, seconds = timed([python, os.path.join(HERE, "preprocess_peer.py"), data,
                                     peer_out, str(workers), str(args.shard)])
            if result.returncode != 0:
                sys.exit(f"the Python peer failed:\n{result.stderr}")
            times["peer"].append(seconds)
            times["peer-inner"].append(json.loads(result.stdout)["seconds"])
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append((workers, med))

    # Resume: half the shards recorded, then killed; the same command finishes the job.
    workers = max(int(w) for w in args.workers.split(","))
    job = job_file(args.dir, data, out, workers, True, args.shard)
    shards = (images + args.shard - 1) // args.shard
    half = shards // 2
    full, resumed, noop = [], [], []
    for r in range(args.repeat):
        _, seconds = run_ferry(ferry, job, out)
        full.append(seconds)
        env = dict(os.environ, FERRY_PREPROCESS_KILL_AT=f"part-done:{half}")
        killed, _ = run_ferry(ferry, job, out, env)
        assert killed.returncode != 0, "the kill point was not reached"
        result, seconds = run_ferry(ferry, job, out, fresh=False)
        assert result.returncode == 0, result.stderr
        resumed.append(seconds)
        _, seconds = run_ferry(ferry, job, out, fresh=False)
        noop.append(seconds)

    print(f"\n{images} photos 500x375 -> Resize(256), CenterCrop(224), JPEG 90, shards of "
          f"{args.shard}; medians of {args.repeat} runs; images/s of whole processes\n")
    print("| workers | ferry | ferry, exact resampling | Python peer | peer without start-up | "
          "ferry / peer (without start-up) | exact / peer |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for workers, med in rows:
        rate = {k: images / v for k, v in med.items()}
        print(f"| {workers} | {rate['ferry']:.0f} | {rate['ferry-exact']:.0f} | {rate['peer']:.0f} "
              f"| {rate['peer-inner']:.0f} | {rate['ferry'] / rate['peer-inner']:.2f}x "
              f"| {rate['ferry-exact'] / rate['peer-inner']:.2f}x |")
    f, r, n = (statistics.median(x) for x in (full, resumed, noop))
    left = shards - half
    print(f"\nResume ({workers} workers, {shards} shards): full job {f:.2f} s; killed after "
          f"{half} shards were recorded, the rerun took {r:.2f} s = {r / f:.2f} of the full job "
          f"for {left / shards:.2f} of its shards; a rerun of the finished job {n:.2f} s.")


if __name__ == "__main__":
    main()
