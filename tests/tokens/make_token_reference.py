#!/usr/bin/python3
"""Writes the token files, bad files and expected values that the C++ tests of ferry's token
datasets (npy, indexed, gpt, token_windows, and the llm.c and nanoGPT readers) compare against.

Usage (run by ctest as a fixture; needs only the standard library and numpy 1.24 or 2.x):

    python3 tests/tokens/make_token_reference.py OUT_DIR

Deterministic: every value comes from a fixed list or a numpy.random.RandomState with a fixed
seed. Takes about a second.

OUT_DIR/manifest.json describes everything; the C++ tests read only it and the files it names
(paths are relative to OUT_DIR). Its keys:

  npy           .npy files of every dtype in format versions 1, 2 and 3, plus 1-D, 3-D and
                empty arrays: {file, dtype, version, shape, values (flat, C order)}.
  npy_bad       .npy files a reader must refuse: {file, expect, note}; `expect` is a lowercase
                substring the error message must contain.
  indexed       Megatron-LM and fairseq indexed datasets (.idx + .bin, written here byte by byte
                as megatron/core/datasets/indexed_dataset.py and fairseq/data/indexed_dataset.py
                lay them out): {prefix, kind, dtype, sequences, document_indices (Megatron)}.
  indexed_bad   {prefix, kind, expect, note}.
  nanogpt       raw little-endian token arrays with no header (nanoGPT's prepare.py):
                {file, dtype, values}.
  llmc          llm.c shards (dev/data/data_common.py: 256 int32 header, then the tokens):
                {file, magic, version, dtype, values}.
  llmc_bad      {file, expect, note}.
  gpt           Megatron-LM GPTDataset indices and samples computed here in Python exactly as
                Megatron builds them (gpt_dataset.py, helpers.cpp build_sample_idx with
                drop_last_partial_sequence True, Megatron's default for every split;
                blended_megatron_dataset_builder.py for the split), checked against a
                brute-force reading of the token stream. Per case: its parameters, num_epochs,
                separate_final_epoch, num_samples_built (S, the dataset's length),
                document_index, sample_index ([doc_pos, offset] rows), shuffle_index,
                sample_ids (0 .. min(40, num_samples) - 1 and S - 5 .. S - 1) and samples (the
                `text` GPTDataset.__getitem__ reads for each, seq_length + extra tokens). `cache`
                is a folder holding the three arrays as Megatron caches them,
                <hash>-GPTDataset-<train|valid|test>-{document,sample,shuffle}_index.npy, with
                the -description.txt whose md5 is <hash>.
  windows       metadata for the token_windows test: {file, dtype, block_size}.
"""
import hashlib
import json
import os
import struct
import sys

import numpy as np
from numpy.lib import format as npy_format

NPY_MAGIC = b"\x93NUMPY"
IDX_MAGIC = b"MMIDIDX\x00\x00"

# Dtype codes in the .idx header. The two projects share codes 1-5 and 8 but differ after that:
# Megatron's 7 is float32 and it stops at 8; fairseq's 6 and 7 are both float64 and it adds 9
# (uint32) and 10 (uint64).
MEGATRON_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6,
                  "float32": 7, "uint16": 8}
FAIRSEQ_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6,
                 "uint16": 8, "uint32": 9, "uint64": 10}

LLMC_GPT2 = (20240520, 1, "uint16")    # (magic, version, token dtype)
LLMC_LLAMA3 = (20240801, 7, "uint32")

NPY_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64"]


def le(dtype):
    """The little-endian numpy dtype of a name: every format here is little-endian on disk,
    whatever the machine running this script."""
    return np.dtype(dtype).newbyteorder("<")


def write_bytes(out_dir, rel, data):
    path = os.path.join(out_dir, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


# ----------------------------------------------------------------------------------------------
# .npy
# ----------------------------------------------------------------------------------------------

def npy_values(dtype, count, seed):
    """`count` values of `dtype` that catch a reader mixing up width or signedness: the extremes
    of the type first, then random bit patterns (so signed types get negatives and unsigned ones
    values above the signed maximum of the same width)."""
    rs = np.random.RandomState(seed)
    if dtype == "bool":
        return rs.randint(0, 2, size=count).astype(np.bool_)
    if dtype.startswith("float"):
        # Multiples of 0.25 in [-8, 8] are exact in float16, so JSON round-trips them exactly.
        return (rs.randint(-32, 33, size=count) * 0.25).astype(dtype)
    dt = le(dtype)
    values = np.frombuffer(rs.bytes(count * dt.itemsize), dtype=dt).copy()
    info = np.iinfo(dt)
    if info.min < 0:
        extremes = [info.min, info.max, -1, 0]
    else:
        # info.max // 2 + 1 is the smallest value a same-width signed read gets wrong.
        extremes = [info.max, 0, info.max // 2 + 1, info.max // 2 + 7]
    values[:len(extremes)] = extremes
    return values


def npy_bytes(array, version):
    """An .npy file with the format version written explicitly (numpy.save picks the lowest
    version that fits, which would always be 1 here)."""
    class Sink:
        def __init__(self):
            self.parts = []

        def write(self, data):
            self.parts.append(bytes(data))

    sink = Sink()
    npy_format.write_array(sink, array, version=(version, 0))
    return b"".join(sink.parts)


def npy_header(descr, fortran_order, shape, major=1):
    """A hand-written .npy header, for files numpy would refuse to write. Laid out as numpy lays
    it out: magic, version, little-endian header length (2 bytes in v1, 4 after), a dict literal
    padded with spaces to a multiple of 64 bytes and ending in a newline."""
    text = "{'descr': %r, 'fortran_order': %r, 'shape': %r, }" % (
        descr, fortran_order, tuple(shape))
    len_format = "<H" if major == 1 else "<I"
    prefix = len(NPY_MAGIC) + 2 + struct.calcsize(len_format)
    pad = -(prefix + len(text) + 1) % 64
    text = text + " " * pad + "\n"
    return NPY_MAGIC + bytes([major, 0]) + struct.pack(len_format, len(text)) + text.encode()


def write_npy(out_dir):
    good = []

    def add(rel, array, version):
        write_bytes(out_dir, rel, npy_bytes(array, version))
        good.append({"file": rel, "dtype": str(array.dtype), "version": version,
                     "shape": list(array.shape),
                     "values": array.reshape(-1).astype(
                         np.uint8 if array.dtype == np.bool_ else array.dtype).tolist()})

    for i, dtype in enumerate(NPY_DTYPES):
        for version in (1, 2, 3):
            array = npy_values(dtype, 15, seed=100 * i + version).reshape(5, 3)
            add(f"npy/{dtype}_v{version}.npy", array, version)
    add("npy/int32_1d.npy", npy_values("int32", 7, seed=7001), 1)
    add("npy/uint16_4x2x3.npy", npy_values("uint16", 24, seed=7002).reshape(4, 2, 3), 2)
    add("npy/int64_empty_0x4.npy", np.zeros((0, 4), dtype=np.int64), 1)

    bad = []

    def add_bad(rel, data, expect, note):
        write_bytes(out_dir, rel, data)
        bad.append({"file": rel, "expect": expect, "note": note})

    base = npy_values("int32", 15, seed=7003).reshape(5, 3)
    # A [5, 3] array that is Fortran- but not C-contiguous makes numpy write fortran_order True.
    add_bad("npy_bad/fortran_order.npy", npy_bytes(np.asfortranarray(base), 1),
            "fortran_order", "[5, 3] int32 with fortran_order True")
    add_bad("npy_bad/big_endian.npy", npy_bytes(base.astype(">i4"), 1), "descr",
            "[5, 3] int32 stored big-endian ('>i4')")
    add_bad("npy_bad/object.npy", npy_header("|O", False, (2,)), "descr",
            "descr '|O' (pickled objects), header only")
    add_bad("npy_bad/short_data.npy", npy_header("<i4", False, (1000, 3)) + bytes(12), "shape",
            "header says [1000, 3] int32 (12000 bytes); the file holds 12 bytes of data")
    add_bad("npy_bad/truncated_header.npy", npy_bytes(base, 1)[:40], "header",
            "a valid v1 file cut after 40 bytes, inside its header")
    add_bad("npy_bad/bad_magic.npy", b"\x93NUMPX" + npy_bytes(base, 1)[6:], "magic",
            "the sixth magic byte is 'X'")
    add_bad("npy_bad/empty.npy", b"", "empty", "zero bytes")
    add_bad("npy_bad/version4.npy", npy_header("<i4", False, (5, 3), major=4)
            + base.astype(le("int32")).tobytes(), "version", "format version 4.0")
    return good, bad


# ----------------------------------------------------------------------------------------------
# Indexed datasets (.idx + .bin)
# ----------------------------------------------------------------------------------------------

def idx_bytes(kind, code, lengths, pointers, document_indices=None, version=1, magic=IDX_MAGIC):
    """The .idx of `kind`, from its parts (passed separately so the bad cases can spoil one).

    Megatron: magic, <Q version, <B dtype code, <Q N, <Q D, int32 lengths[N], int64 pointers[N],
    int64 document_indices[D]; 34 + 12N + 8D bytes. fairseq: magic, <Q version, <B code, <Q N,
    int32 sizes[N], int64 pointers[N]; 26 + 12N bytes."""
    head = magic + struct.pack("<Q", version) + struct.pack("<B", code)
    head += struct.pack("<Q", len(lengths))
    if kind == "megatron":
        head += struct.pack("<Q", len(document_indices))
    body = (np.asarray(lengths, dtype=le("int32")).tobytes()
            + np.asarray(pointers, dtype=le("int64")).tobytes())
    if kind == "megatron":
        body += np.asarray(document_indices, dtype=le("int64")).tobytes()
    return head + body


def indexed_parts(dtype, sequences):
    """(lengths, byte pointers into .bin, .bin contents) of a list of token arrays."""
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    pointers = np.zeros(len(sequences), dtype=np.int64)
    pointers[1:] = np.cumsum(lengths[:-1]) * le(dtype).itemsize
    data = np.concatenate(sequences).astype(le(dtype)).tobytes()
    return lengths, pointers, data


def write_indexed(out_dir, prefix, kind, dtype, sequences, document_indices=None):
    codes = MEGATRON_CODES if kind == "megatron" else FAIRSEQ_CODES
    lengths, pointers, data = indexed_parts(dtype, sequences)
    idx = idx_bytes(kind, codes[dtype], lengths, pointers, document_indices)
    n, d = len(sequences), len(document_indices or [])
    assert len(idx) == (34 + 12 * n + 8 * d if kind == "megatron" else 26 + 12 * n)
    write_bytes(out_dir, prefix + ".idx", idx)
    write_bytes(out_dir, prefix + ".bin", data)
    entry = {"prefix": prefix, "kind": kind, "dtype": dtype,
             "sequences": [s.tolist() for s in sequences]}
    if kind == "megatron":
        entry["document_indices"] = list(document_indices)
    return entry


def random_corpus(seed, num_documents, high, dtype, max_sequences=4, max_length=200):
    """Documents of 1..max_sequences sequences of 1..max_length tokens in [0, high). Returns
    (sequences, document_indices) in Megatron's sense: document d spans sequences
    [document_indices[d], document_indices[d + 1])."""
    rs = np.random.RandomState(seed)
    sequences, document_indices = [], [0]
    for _ in range(num_documents):
        for _ in range(rs.randint(1, max_sequences + 1)):
            length = rs.randint(1, max_length + 1)
            sequences.append(rs.randint(0, high, size=length, dtype=np.int64).astype(dtype))
        document_indices.append(len(sequences))
    return sequences, document_indices


def make_indexed(out_dir):
    """Writes the good datasets; returns (manifest entries, {prefix: sequences})."""
    entries, corpora = [], {}

    def add(prefix, kind, dtype, sequences, document_indices=None):
        entries.append(write_indexed(out_dir, prefix, kind, dtype, sequences, document_indices))
        corpora[prefix] = sequences

    seqs, docs = random_corpus(11, 60, 65000, "uint16")
    assert max(int(s.max()) for s in seqs) > 32767  # a signed 16-bit read must go wrong
    add("indexed/megatron_u16", "megatron", "uint16", seqs, docs)
    seqs, docs = random_corpus(12, 40, 100001, "int32")
    assert max(int(s.max()) for s in seqs) > 65535
    add("indexed/megatron_i32", "megatron", "int32", seqs, docs)
    seqs, docs = random_corpus(13, 6, 2 ** 40, "int64", max_length=20)
    add("indexed/megatron_i64", "megatron", "int64", seqs, docs)
    seqs, _ = random_corpus(14, 50, 3000000001, "uint32", max_sequences=1)
    assert max(int(s.max()) for s in seqs) > 2 ** 31  # a signed 32-bit read must go wrong
    add("indexed/fairseq_u32", "fairseq", "uint32", seqs)
    seqs, _ = random_corpus(15, 30, 65000, "uint16", max_sequences=1)
    assert max(int(s.max()) for s in seqs) > 32767
    add("indexed/fairseq_u16", "fairseq", "uint16", seqs)
    return entries, corpora


def make_indexed_bad(out_dir):
    """Each bad dataset is a small good one with one thing spoilt."""
    seqs, docs = random_corpus(16, 5, 65000, "uint16", max_length=30)
    n = len(seqs)
    lengths, pointers, data = indexed_parts("uint16", seqs)
    assert lengths[-1] > 5
    code = MEGATRON_CODES["uint16"]
    good_idx = idx_bytes("megatron", code, lengths, pointers, docs)
    entries = []

    def add(name, kind, idx, bin_data, expect, note):
        prefix = "indexed_bad/" + name
        write_bytes(out_dir, prefix + ".idx", idx)
        write_bytes(out_dir, prefix + ".bin", bin_data)
        entries.append({"prefix": prefix, "kind": kind, "expect": expect, "note": note})

    add("bin_truncated", "megatron", good_idx, data[:-6], "bin",
        ".bin 6 bytes shorter than the last pointer + length * 2; .idx consistent")
    far = pointers.copy()
    far[-1] = len(data) + 64
    add("pointer_past_bin", "megatron", idx_bytes("megatron", code, lengths, far, docs), data,
        "pointer", "the last pointer lies 64 bytes past the end of an intact .bin")
    add("bad_magic", "megatron", b"MMIDIDY\x00\x00" + good_idx[9:], data, "magic",
        "magic MMIDIDY")
    add("version2", "megatron", idx_bytes("megatron", code, lengths, pointers, docs, version=2),
        data, "version", "version 2")
    add("dtype99", "megatron", idx_bytes("megatron", 99, lengths, pointers, docs), data, "dtype",
        "dtype code 99")
    add("idx_short", "megatron", good_idx[:34 + 4 * n + 8 * (n // 2)], data, "idx",
        "the .idx cut in the middle of its pointers")
    add("document_end", "megatron",
        idx_bytes("megatron", code, lengths, pointers, docs[:-1] + [n - 1]), data, "document",
        "document_indices ends with N - 1 instead of N")

    fs_idx = idx_bytes("fairseq", FAIRSEQ_CODES["uint16"], lengths, pointers)
    add("fairseq_bin_truncated", "fairseq", fs_idx, data[:-6], "bin",
        ".bin 6 bytes shorter than the last pointer + length * 2")
    add("fairseq_idx_short", "fairseq", fs_idx[:-5], data, "idx",
        "the .idx 5 bytes short of 26 + 12N")
    add("fairseq_dtype99", "fairseq", idx_bytes("fairseq", 99, lengths, pointers), data,
        "dtype", "dtype code 99")
    return entries


# ----------------------------------------------------------------------------------------------
# nanoGPT and llm.c
# ----------------------------------------------------------------------------------------------

def make_raw(out_dir):
    rs = np.random.RandomState(21)
    u16 = rs.randint(0, 50257, size=3000).astype(np.uint16)   # GPT-2's vocabulary
    assert int(u16.max()) > 32767
    u32 = rs.randint(0, 2 ** 32, size=2000, dtype=np.uint64).astype(np.uint32)
    assert int(u32.max()) > 2 ** 31
    entries = []
    for rel, values in (("nanogpt/train_u16.bin", u16), ("nanogpt/train_u32.bin", u32)):
        write_bytes(out_dir, rel, values.astype(le(values.dtype)).tobytes())
        entries.append({"file": rel, "dtype": str(values.dtype), "values": values.tolist()})
    return entries


def llmc_bytes(magic, version, tokens, dtype, count=None):
    header = np.zeros(256, dtype=le("int32"))
    header[:3] = [magic, version, len(tokens) if count is None else count]
    return header.tobytes() + np.asarray(tokens).astype(le(dtype)).tobytes()


def make_llmc(out_dir):
    rs = np.random.RandomState(31)
    shards = [("llmc/gpt2_000000.bin", LLMC_GPT2, rs.randint(0, 50257, size=1500)),
              # Llama-3's vocabulary is 128256: values above 65535 catch a uint16 read.
              ("llmc/llama3_000000.bin", LLMC_LLAMA3, rs.randint(0, 128256, size=1500))]
    good = []
    for rel, (magic, version, dtype), tokens in shards:
        assert int(tokens.max()) > (65535 if dtype == "uint32" else 32767)
        write_bytes(out_dir, rel, llmc_bytes(magic, version, tokens, dtype))
        good.append({"file": rel, "magic": magic, "version": version, "dtype": dtype,
                     "values": tokens.tolist()})

    tokens = rs.randint(0, 50257, size=1000)
    bad = []
    for rel, data, expect, note in (
            ("llmc_bad/bad_magic.bin", llmc_bytes(12345, 1, tokens, "uint16"), "magic",
             "magic 12345"),
            ("llmc_bad/gpt2_version7.bin", llmc_bytes(LLMC_GPT2[0], 7, tokens, "uint16"),
             "version", "GPT-2 magic with Llama-3's version 7"),
            ("llmc_bad/count_too_big.bin",
             llmc_bytes(LLMC_GPT2[0], 1, tokens, "uint16", count=2000), "count",
             "header says 2000 tokens; the file holds 1000"),
            ("llmc_bad/short_header.bin", llmc_bytes(LLMC_GPT2[0], 1, [], "uint16")[:500],
             "header", "500 bytes, less than the 1024-byte header")):
        write_bytes(out_dir, rel, data)
        bad.append({"file": rel, "expect": expect, "note": note})
    return good, bad


# ----------------------------------------------------------------------------------------------
# Megatron-LM GPTDataset
# ----------------------------------------------------------------------------------------------

SPLIT_NAMES = ["train", "valid", "test"]


def split_range(split, index, num_sequences):
    """[beg, end) of split `index`: blended_megatron_dataset_config.py normalises the weights
    with numpy and sums them into book-ends; the builder rounds book-end * N half to even."""
    weights = np.array([float(w) for w in split.split(",")], dtype=np.float64)
    weights = (weights / np.sum(weights)).tolist()
    bookends = [0]
    for w in weights:
        bookends.append(bookends[-1] + w)
    assert bookends[index + 1] > bookends[index], "Megatron makes no dataset for an empty split"
    beg = int(round(bookends[index] * float(num_sequences)))
    end = int(round(bookends[index + 1] * float(num_sequences)))
    return beg, end


def epochs_and_separation(tokens_per_epoch, seq_length, extra, num_samples):
    """(num_epochs, separate_final_epoch, num_samples_sans_final_epoch) as
    GPTDataset._build_document_sample_shuffle_indices computes them."""
    epochs, tokens = 1, tokens_per_epoch
    while tokens < num_samples * seq_length + extra:
        epochs += 1
        tokens += tokens_per_epoch
    if epochs == 1:
        return epochs, False, None
    sans = ((epochs - 1) * tokens_per_epoch - extra) // seq_length
    from_last = num_samples - sans
    per_epoch = (tokens_per_epoch - extra) // seq_length
    assert 0 <= from_last <= per_epoch + 1
    # Megatron gives the last epoch a shuffle of its own when it is used less than 80%.
    return epochs, from_last < int(0.80 * per_epoch), sans


def build_sample_index(sizes, document_index, seq_length, extra, epochs, tokens_per_epoch):
    """helpers.cpp build_sample_idx with drop_last_partial_sequence True: row i is
    (position in document_index, token offset in that sequence) where sample i starts; sample i
    ends where row i + 1 starts, plus `extra` tokens."""
    num_samples = (epochs * tokens_per_epoch - extra) // seq_length
    rows = [(0, 0)]
    pos, offset = 0, 0
    while len(rows) <= num_samples:
        remaining = seq_length + extra
        while remaining != 0:
            length = int(sizes[document_index[pos]]) - offset
            remaining -= length
            if remaining <= 0:
                # The sample ends inside this sequence; the next one starts `extra` tokens
                # before that end, so consecutive samples share `extra` tokens.
                offset += remaining + length - extra
                remaining = 0
            else:
                # With drop_last the stream never runs out before the last row.
                assert pos != len(document_index) - 1
                pos += 1
                offset = 0
        rows.append((pos, offset))
    return rows


def build_gpt_case(out_dir, name, prefix, sequences, split, split_index, seed, seq_length,
                   num_samples, add_extra_token, expect_epochs=None, expect_separate=None):
    """Builds GPTDataset's three indices and reads samples as GPTDataset.__getitem__ does, then
    checks the result against a brute-force reading of the token stream."""
    sizes = np.array([len(s) for s in sequences], dtype=np.int32)
    beg, end = split_range(split, split_index, len(sequences))
    # GPTDataset treats every sequence of the .idx as a document; its document_indices unused.
    indices = np.arange(beg, end, dtype=np.int32)
    extra = 1 if add_extra_token else 0
    tokens_per_epoch = int(np.sum(sizes[indices], dtype=np.int64))
    epochs, separate, sans = epochs_and_separation(tokens_per_epoch, seq_length, extra,
                                                   num_samples)
    assert expect_epochs is None or epochs == expect_epochs, (name, epochs)
    assert expect_separate is None or separate == expect_separate, (name, separate)

    # One RandomState serves every shuffle, in Megatron's order: document index (all epochs,
    # or all but the last then the last), then the shuffle index (one or two ranges).
    rs = np.random.RandomState(seed)
    if not separate:
        document_index = np.tile(indices, epochs).astype(np.int32)
        rs.shuffle(document_index)
    else:
        first = np.tile(indices, epochs - 1).astype(np.int32)
        rs.shuffle(first)
        last = indices.copy().astype(np.int32)
        rs.shuffle(last)
        document_index = np.concatenate((first, last))

    rows = build_sample_index(sizes, document_index, seq_length, extra, epochs,
                              tokens_per_epoch)
    int32_max = np.iinfo(np.int32).max
    fits_int32 = max(len(document_index), int(sizes.max())) <= int32_max
    sample_index = np.array(rows, dtype=np.int32 if fits_int32 else np.int64)
    total = len(rows) - 1

    shuffle_dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first_range = sans if separate else total
    shuffle_index = np.arange(0, first_range, dtype=shuffle_dtype)
    rs.shuffle(shuffle_index)
    if first_range != total:
        second = np.arange(first_range, total, dtype=shuffle_dtype)
        rs.shuffle(second)
        shuffle_index = np.concatenate((shuffle_index, second))

    def read_sample(k):
        i = int(shuffle_index[k])
        (b, b_off), (e, e_off) = sample_index[i], sample_index[i + 1]
        if b == e:
            parts = [sequences[document_index[b]][b_off:e_off + extra]]
        else:
            parts = [sequences[document_index[b]][b_off:]]
            parts += [sequences[document_index[j]] for j in range(b + 1, e)]
            parts.append(sequences[document_index[e]][:e_off + extra])
        text = np.concatenate(parts).astype(np.int64)
        assert len(text) == seq_length + extra, (name, k, len(text))
        return text

    # Brute force: in the stream of document_index's sequences, sample i (before shuffling) is
    # stream[i * L : i * L + L + extra], and row i points at token i * L.
    stream = np.concatenate([sequences[d] for d in document_index]).astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes[document_index], dtype=np.int64)))
    for i, (pos, offset) in enumerate(rows):
        assert starts[pos] + offset == i * seq_length, (name, i)
    inverse = np.empty(total, dtype=np.int64)
    inverse[shuffle_index.astype(np.int64)] = np.arange(total)
    assert sorted(shuffle_index.tolist()) == list(range(total))
    for i in range(total):
        want = stream[i * seq_length:i * seq_length + seq_length + extra]
        assert np.array_equal(read_sample(int(inverse[i])), want), (name, i)

    # The cache Megatron writes and reloads: <hash>-GPTDataset-<split>-<what>.npy, where the
    # hash is the md5 of the -description.txt beside them. Our description is not Megatron's
    # text (that lists its whole config), but keeps the same relation to the hash.
    split_name = SPLIT_NAMES[split_index]
    description = json.dumps({"class": "GPTDataset", "dataset_path": prefix,
                              "index_split": split_name, "split": split,
                              "num_samples": num_samples, "random_seed": seed,
                              "sequence_length": seq_length,
                              "add_extra_token_to_sequence": add_extra_token}, indent=4)
    digest = hashlib.md5(description.encode()).hexdigest()
    cache = f"gpt/{name}"
    base = os.path.join(out_dir, cache, f"{digest}-GPTDataset-{split_name}-")
    os.makedirs(os.path.dirname(base), exist_ok=True)
    with open(base + "description.txt", "w") as f:
        f.write(description)
    np.save(base + "document_index.npy", document_index, allow_pickle=True)
    np.save(base + "sample_index.npy", sample_index, allow_pickle=True)
    np.save(base + "shuffle_index.npy", shuffle_index, allow_pickle=True)

    sample_ids = sorted(set(range(min(40, num_samples, total)))
                        | set(range(max(0, total - 5), total)))
    return {"name": name, "prefix": prefix, "split": split, "split_index": split_index,
            "seed": seed, "seq_length": seq_length, "num_samples": num_samples,
            "add_extra_token": add_extra_token, "num_epochs": epochs,
            "separate_final_epoch": separate, "tokens_per_epoch": tokens_per_epoch,
            "split_begin": beg, "split_end": end, "num_samples_built": total,
            "cache": cache, "cache_hash": digest,
            "document_index": document_index.tolist(),
            "sample_index": sample_index.tolist(),
            "shuffle_index": shuffle_index.tolist(),
            "sample_ids": sample_ids,
            "samples": [read_sample(k).tolist() for k in sample_ids]}


def make_gpt(out_dir, corpora):
    u16, i32 = "indexed/megatron_u16", "indexed/megatron_i32"

    def tokens(prefix, split, index):
        seqs = corpora[prefix]
        beg, end = split_range(split, index, len(seqs))
        return sum(len(s) for s in seqs[beg:end])

    def into_epoch(prefix, split, index, seq_length, extra, epochs, from_last):
        """num_samples that needs `epochs` epochs and takes `from_last` samples from the last,
        so the cases keep their shape if the corpus changes."""
        t = tokens(prefix, split, index)
        return ((epochs - 1) * t - extra) // seq_length + from_last

    def per_epoch(prefix, split, index, seq_length, extra):
        return (tokens(prefix, split, index) - extra) // seq_length

    # (name, prefix, split, split index, seed, L, num_samples, extra token, E, separate);
    # E and separate, where given, are asserted.
    cases = [
        ("u16_train_L64_one_epoch", u16, "969,30,1", 0, 1234, 64, 100, True, 1, False),
        ("u16_train_L16_three_epochs", u16, "969,30,1", 0, 7, 16,
         into_epoch(u16, "969,30,1", 0, 16, 1, 3, per_epoch(u16, "969,30,1", 0, 16, 1) - 1),
         True, 3, False),
        ("u16_train_L256_separate", u16, "969,30,1", 0, 99, 256,
         into_epoch(u16, "969,30,1", 0, 256, 1, 3, 3), True, 3, True),
        ("u16_valid_80_10_10_L64", u16, "80,10,10", 1, 5, 64, 60, True, None, None),
        ("i32_train_L64_no_extra", i32, "969,30,1", 0, 31337, 64,
         into_epoch(i32, "969,30,1", 0, 64, 0, 2, per_epoch(i32, "969,30,1", 0, 64, 0) - 2),
         False, 2, False),
        ("i32_train_L256_few_samples", i32, "969,30,1", 0, 2024, 256, 20, True, 1, False),
        ("i32_valid_969_30_1_L16_many_epochs", i32, "969,30,1", 1, 11, 16, 200, True, None,
         None),
        ("i32_test_80_10_10_L16_separate_no_extra", i32, "80,10,10", 2, 3, 16,
         into_epoch(i32, "80,10,10", 2, 16, 0, 2, 1), False, 2, True),
    ]
    return [build_gpt_case(out_dir, name, prefix, corpora[prefix], split, index, seed, length,
                           num_samples, extra, expect_epochs=e, expect_separate=s)
            for name, prefix, split, index, seed, length, num_samples, extra, e, s in cases]


# ----------------------------------------------------------------------------------------------

def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 tests/tokens/make_token_reference.py OUT_DIR")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)

    npy_good, npy_bad = write_npy(out_dir)
    indexed, corpora = make_indexed(out_dir)
    nanogpt = make_raw(out_dir)
    llmc, llmc_bad = make_llmc(out_dir)
    manifest = {
        "generator": f"make_token_reference.py with numpy {np.__version__}",
        "npy": npy_good,
        "npy_bad": npy_bad,
        "indexed": indexed,
        "indexed_bad": make_indexed_bad(out_dir),
        "nanogpt": nanogpt,
        "llmc": llmc,
        "llmc_bad": llmc_bad,
        "gpt": make_gpt(out_dir, corpora),
        "windows": {"file": nanogpt[0]["file"], "dtype": nanogpt[0]["dtype"], "block_size": 8},
    }
    # Written last and atomically, so a run that fails part-way leaves no manifest to trust.
    path = os.path.join(out_dir, "manifest.json")
    with open(path + ".tmp", "w") as f:
        json.dump(manifest, f, separators=(",", ":"))
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
