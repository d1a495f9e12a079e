#!/usr/bin/env python3
"""`ferry run` under real launchers on one machine (ctest label `launch`).

1. torchrun (`python3 -m torch.distributed.run --no-python`) and Open MPI's `mpirun` start four
   ranks of `ferry run` over a pipeline with `sampler: {type: distributed}`, which takes rank and
   world size from the launcher. Every rank's indices must equal PyTorch's DistributedSampler for
   that rank (Debian's python3-torch), the ranks must cover the dataset without overlap (but for
   PyTorch's padding), and every rank must yield the same number of batches.
2. The same job, saving its state every two batches, is killed with SIGKILL mid-epoch and resumed
   at world size 2 from the checkpoint every rank had reached: across all ranks, the rest of the
   epoch is delivered exactly once.
3. `ferry preprocess` under `mpirun -np 3` and torchrun with 3 ranks: each rank writes its own
   shards into the shared folder, and the union is byte for byte what one process writes.
4. A language-model job: a `gpt` dataset over a Megatron indexed dataset this script writes, under
   torchrun (2 ranks) and mpirun (3 ranks): each rank's samples are PyTorch's DistributedSampler's
   for that rank over the dataset's windows, and together they are every window.

Usage: launchers_test.py FERRY_BINARY
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

try:
    import torch.distributed.run  # noqa: F401  (torchrun)
    from torch.utils.data.distributed import DistributedSampler
except ImportError as e:
    print(f"skipped: {e} (Debian: python3-torch)")
    sys.exit(77)

N = 1003
BATCH = 4
SEED = 5


def config(folder, load_us):
    path = os.path.join(folder, f"pipeline-{load_us}.yaml")
    with open(path, "w") as f:
        f.write(
            f"dataset: {{type: synthetic, size: {N}, shape: [2], load_us: {load_us}}}\n"
            f"sampler: {{type: distributed, seed: {SEED}}}\n"
            f"loader: {{batch_size: {BATCH}, num_workers: 1, seed: 0}}\n")
    return path


def tcp_store_works():
    """Whether this torch can make the TCPStore torchrun's static rendezvous makes: Debian 13's
    torch 2.6 cannot ("use_libuv was requested but PyTorch was build without libuv support")."""
    try:
        from torch.distributed import TCPStore
        from datetime import timedelta
        TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))
        return True
    except (RuntimeError, ImportError) as e:
        print(f"torch's TCPStore: {e}; torchrun meets at a file store instead")
        return False


TCP_STORE = None


def torchrun(n, folder):
    # --redirects/--tee 1: Debian's torch 1.13 on Python 3.11 parses only single-bit values
    # (IntFlag iterates no zero or multi-bit member), so its default of 0 fails every run.
    # --log_dir: a fresh folder inside ours (torchrun's default is a torchelastic_* in /tmp).
    # Where torch can make a TCPStore, the static rendezvous on 127.0.0.1 at a free port
    # (--standalone's fixed localhost:29400 needs a resolvable "localhost" and clashes with
    # another run of this test). Where it cannot (Debian 13's torch 2.6), the c10d rendezvous
    # through a file store of its own, with TORCH_DISABLE_SHARE_RDZV_TCP_STORE (set in main)
    # so that torch 2.x starts no TCPStore for the workers after it.
    global TCP_STORE
    if TCP_STORE is None:
        TCP_STORE = tcp_store_works()
    logs = tempfile.mkdtemp(prefix="torchrun-", dir=folder)
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               f"--nproc_per_node={n}", "--redirects", "1", "--tee", "1", "--log_dir", logs,
               "--no_python"]
    if TCP_STORE:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return command[:-1] + ["--master_addr=127.0.0.1", f"--master_port={port}", "--no_python"]
    store = os.path.join(logs, "rendezvous")
    return command[:-1] + ["--rdzv_backend=c10d", f"--rdzv_endpoint={store}",
                           "--rdzv_conf=store_type=file", f"--rdzv_id={os.path.basename(logs)}",
                           "--no_python"]


def mpirun(n):
    command = ["mpirun", "-np", str(n), "--oversubscribe"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    return command


def process_tree(root):
    """`root` and every process below it (from /proc), children before their parents' return."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, []))
    return tree


def kill_tree(root):
    """SIGKILLs `root` and all below it at once, as a node's loss would: torch 2.x's torchrun
    starts each rank in a session of its own, which killing torchrun's group would miss."""
    for pid in process_tree(root):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def read_dump(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def pytorch_indices(world, rank, epoch=0):
    sampler = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    sampler.set_epoch(epoch)
    return list(sampler)


def check_ranks(name, dumps, world):
    counts = {len(d) for d in dumps}
    assert len(counts) == 1, f"{name}: ranks yield different numbers of batches: {counts}"
    everything = []
    for rank, batches in enumerate(dumps):
        got = [i for b in batches for i in b["indices"]]
        want = pytorch_indices(world, rank)
        assert got == want, f"{name}: rank {rank} differs from PyTorch's DistributedSampler"
        everything += got
    assert sorted(set(everything)) == list(range(N)), f"{name}: the ranks do not cover the dataset"
    padding = -N % world
    assert len(everything) == N + padding, f"{name}: {len(everything) - N} repeats, not {padding}"
    print(f"{name}: {world} ranks, {counts.pop()} batches each, equal to PyTorch's, disjoint")


def write_indexed(prefix, lengths, seed):
    """Megatron's indexed dataset (MMIDIDX version 1, uint16 tokens): PREFIX.idx and PREFIX.bin,
    one document per sequence."""
    import struct
    import numpy as np
    rng = np.random.RandomState(seed)
    tokens = [rng.randint(0, 50000, size=n).astype("<u2") for n in lengths]
    pointers = np.concatenate([[0], np.cumsum([2 * n for n in lengths])[:-1]]).astype("<i8")
    with open(prefix + ".bin", "wb") as f:
        for t in tokens:
            f.write(t.tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
        f.write(struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(lengths) + 1))
        f.write(np.asarray(lengths, dtype="<i4").tobytes() + pointers.tobytes())
        f.write(np.arange(len(lengths) + 1, dtype="<i8").tobytes())


def gpt_under_launchers(ferry, folder, env):
    seq_length = 16
    lengths = [5 + (37 * d) % 90 for d in range(60)]
    prefix = os.path.join(folder, "tokens")
    write_indexed(prefix, lengths, 3)
    # One epoch of the train split, which holds every document: Megatron's
    # (tokens - add_extra_token) // seq_length windows.
    windows = (sum(lengths) - 1) // seq_length
    job = os.path.join(folder, "gpt.yaml")
    with open(job, "w") as f:
        f.write(f"dataset: {{type: gpt, prefix: {prefix}, seq_length: {seq_length}, seed: 11, "
                "split: '1,0,0'}\n"
                f"sampler: {{type: distributed, seed: {SEED}}}\n"
                "loader: {batch_size: 4, num_workers: 1}\n")
    for name, world, launcher in (("torchrun", 2, torchrun(2, folder)), ("mpirun", 3, mpirun(3))):
        dump = os.path.join(folder, f"gpt-{name}-{{rank}}.jsonl")
        run(launcher + [ferry, "run", job, "--dump-indices", dump], env)
        dumps = [read_dump(dump.format(rank=r)) for r in range(world)]
        assert len({len(d) for d in dumps}) == 1, f"gpt {name}: ranks yield different batch counts"
        everything = []
        for rank, batches in enumerate(dumps):
            got = [i for b in batches for i in b["indices"]]
            sampler = DistributedSampler(range(windows), num_replicas=world, rank=rank,
                                         shuffle=True, seed=SEED)
            assert got == list(sampler), f"gpt {name}: rank {rank} differs from PyTorch's"
            everything += got
        assert sorted(set(everything)) == list(range(windows)), f"gpt {name}: windows missing"
        print(f"gpt under {name}: {world} ranks, {windows} windows of {seq_length + 1} tokens, "
              "each rank PyTorch's DistributedSampler split")


def run(command, env=None, **kwargs):
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, **kwargs)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {result.returncode}:\n"
                         f"{result.stdout}\n{result.stderr}")
    return result


def snapshot(folder):
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, folder)] = f.read()
    return files


def preprocess_under_launchers(ferry, folder, env):
    data = os.path.join(folder, "images")
    run([ferry, "sample-data", data, "--per-class", "8", "--size", "80x60"], env)
    job = os.path.join(folder, "preprocess.yaml")
    with open(job, "w") as f:
        f.write(f"input: {{image_folder: {{root: {data}}}}}\n"
                "transforms: [{resize: {size: 48}}, {center_crop: {size: 40}}]\n"
                'output: {path: "${OUT}", shard_samples: 3}\nworkers: 1\n')
    outputs = {}
    for name, launcher in (("one", []), ("mpirun", mpirun(3)), ("torchrun", torchrun(3, folder))):
        out = os.path.join(folder, "pre-" + name)
        run(launcher + [ferry, "preprocess", job], dict(env, OUT=out))
        outputs[name] = snapshot(out)
    one = outputs["one"]
    shards = sorted(n for n in one if n.endswith(".tar"))
    assert len(shards) == 11 and "stats.json" in one, sorted(one)
    for name in ("mpirun", "torchrun"):
        assert sorted(outputs[name]) == sorted(one), f"{name}: other files than one process wrote"
        differ = [n for n in one if outputs[name][n] != one[n]]
        assert not differ, f"{name}: {differ} differ from one process's"
        print(f"preprocess under {name} with 3 ranks: {len(shards)} shards, identical to one process")


def main():
    ferry = os.path.abspath(sys.argv[1])
    if shutil.which("mpirun") is None:
        print("skipped: mpirun is not installed (Debian: openmpi-bin; ./setup.sh test installs it)")
        sys.exit(77)
    folder = tempfile.mkdtemp(prefix="ferry-launch-")
    env = dict(os.environ)
    for stale in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID",
                  "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        env.pop(stale, None)
    env["OMP_NUM_THREADS"] = "1"
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # see torchrun() (torch 1.13 ignores it)
    try:
        preprocess_under_launchers(ferry, folder, env)
        gpt_under_launchers(ferry, folder, env)
        fast = config(folder, 0)
        for name, launcher in (("torchrun", torchrun(4, folder)), ("mpirun", mpirun(4))):
            dump = os.path.join(folder, name + "-{rank}.jsonl")
            run(launcher + [ferry, "run", fast, "--dump-indices", dump], env)
            check_ranks(name, [read_dump(dump.format(rank=r)) for r in range(4)], 4)

        # Killed mid-epoch, then resumed at world size 2.
        # 5 ms a sample: a rank's epoch (63 batches of 4) takes over a second, so the poll below
        # sees a checkpoint and kills the job well before any rank finishes it, busy machine or not.
        slow = config(folder, 5000)
        states = os.path.join(folder, "state-{rank}.json")
        dumps = os.path.join(folder, "killed-{rank}.jsonl")
        job = subprocess.Popen(
            torchrun(4, folder) + [ferry, "run", slow, "--save-state", states, "--save-every", "2",
                           "--dump-indices", dumps],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        positions = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            positions = {}
            for r in range(4):
                try:
                    with open(states.format(rank=r)) as f:
                        positions[r] = json.load(f)["position"]
                except (OSError, ValueError, KeyError):
                    pass
            if len(positions) == 4 and min(positions.values()) >= 6:
                break
            time.sleep(0.05)
        kill_tree(job.pid)
        job.wait()
        assert len(positions) == 4 and min(positions.values()) >= 6, f"no checkpoint: {positions}"
        # The checkpoint every rank reached: the slowest rank's (a training job saves one state
        # at a step all ranks are in, as ranks in step are), read after the kill (a rank may
        # have saved again between the poll above and the kill).
        positions = {}
        for r in range(4):
            with open(states.format(rank=r)) as f:
                positions[r] = json.load(f)["position"]
        slowest = min(positions, key=positions.get)
        with open(states.format(rank=slowest)) as f:
            state = json.load(f)
        step = state["position"]
        assert state["epoch"] == 0 and step < (N + 3) // 4 // BATCH, state
        consumed = []
        for r in range(4):
            batches = read_dump(dumps.format(rank=r))
            assert len(batches) >= step, f"rank {r} dumped {len(batches)} batches, state says {step}"
            consumed += [i for b in batches[:step] for i in b["indices"]]
        resumed = os.path.join(folder, "resumed-{rank}.jsonl")
        run(torchrun(2, folder) + [ferry, "run", slow, "--resume", states.format(rank=slowest),
                           "--dump-indices", resumed], env)
        rest = [read_dump(resumed.format(rank=r)) for r in range(2)]
        assert len(rest[0]) == len(rest[1]), "the two ranks yield different numbers of batches"
        assert all(b["epoch"] == 0 for d in rest for b in d), "the resumed run left epoch 0"
        delivered = consumed + [i for d in rest for b in d for i in b["indices"]]
        assert sorted(set(delivered)) == list(range(N)), "a sample was lost"
        remaining = N - len(consumed)
        assert len(delivered) == N + remaining % 2, (
            f"{len(delivered) - N} samples delivered twice; padding allows {remaining % 2}")
        print(f"killed at batch {step} of every rank (positions {positions}), resumed on 2 ranks: "
              f"{remaining} samples left, delivered once each ({remaining % 2} padding)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
