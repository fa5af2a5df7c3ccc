"""Training batches, addressed by *global sequence index* so they never depend on topology.

A batch is ``global_batch`` rows of ``seq_len + 1`` tokens (inputs are ``[:, :-1]``, targets
``[:, 1:]``). Row ``r`` of the batch that starts at sequence ``position`` is sequence
``position + r`` of the source, whatever the number of processes; the data position saved in
a checkpoint is that ``position``. Each process materialises only the rows its devices hold
(``jax.make_array_from_callback``), so with a token file it reads only its shard.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

RowSource = Callable[[int, int], np.ndarray]  # (first sequence, count) -> int32 [count, S + 1]


def synthetic_source(seed: int, seq_len: int, vocab: int) -> RowSource:
    """Learnable, deterministic sequences: ``t_i = (a + b * i) mod vocab``, b in 1..4, with
    (a, b) drawn from a generator seeded by (seed, sequence index)."""
    steps = np.arange(seq_len + 1, dtype=np.int64)

    def rows(first: int, count: int) -> np.ndarray:
        out = np.empty((count, seq_len + 1), dtype=np.int32)
        for i in range(count):
            rng = np.random.default_rng((seed, first + i))
            a, b = int(rng.integers(vocab)), int(rng.integers(1, 5))
            out[i] = (a + b * steps) % vocab
        return out

    return rows


class TokenFile:
    """A flat binary file of uint16/uint32 tokens (local path or gs://), cut into windows of
    ``seq_len + 1`` tokens that overlap by one; sequence g is window ``g mod windows``.

    Reads are byte ranges (``pread`` / GCS range requests) of just the requested rows.
    """

    def __init__(self, path: str, dtype: str, seq_len: int, vocab: int):
        self.path, self.seq_len, self.vocab = path, seq_len, vocab
        self.dtype = np.dtype(dtype)
        self.bytes_read = 0
        if path.startswith("gs://"):
            from xrun_contract.storage import gcs_client

            bucket, _, name = path[len("gs://"):].partition("/")
            self._blob = gcs_client().bucket(bucket).blob(name)
            self._blob.reload()
            size = int(self._blob.size or 0)
        else:
            self._blob = None
            size = os.path.getsize(path)
        self.num_tokens = size // self.dtype.itemsize
        self.windows = (self.num_tokens - 1) // seq_len
        if self.windows < 1:
            raise ValueError(f"data {path}: {self.num_tokens} tokens, fewer than seq_len + 1 = "
                             f"{seq_len + 1}")

    def _read(self, first_token: int, count: int) -> np.ndarray:
        start, nbytes = first_token * self.dtype.itemsize, count * self.dtype.itemsize
        if self._blob is not None:
            data = self._blob.download_as_bytes(start=start, end=start + nbytes - 1)
        else:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                data = os.pread(fd, nbytes, start)
            finally:
                os.close(fd)
        if len(data) != nbytes:
            raise OSError(f"data {self.path}: short read at token {first_token}")
        self.bytes_read += nbytes
        return np.frombuffer(data, dtype=self.dtype)

    def __call__(self, first: int, count: int) -> np.ndarray:
        out = np.empty((count, self.seq_len + 1), dtype=np.int32)
        i = 0
        while i < count:  # one read per run of consecutive windows
            w = (first + i) % self.windows
            n = min(count - i, self.windows - w)
            tokens = self._read(w * self.seq_len, n * self.seq_len + 1).astype(np.int64)
            for j in range(n):
                out[i + j] = tokens[j * self.seq_len: (j + 1) * self.seq_len + 1]
            i += n
        if out.size and int(out.max()) >= self.vocab:
            raise ValueError(f"data {self.path}: token {int(out.max())} >= vocab_size {self.vocab}")
        return out


def make_source(data: str, dtype: str, seed: int, seq_len: int, vocab: int) -> RowSource:
    if data == "synthetic":
        return synthetic_source(seed, seq_len, vocab)
    return TokenFile(data, dtype, seq_len, vocab)


def make_batch(source: RowSource, position: int, global_batch: int, seq_len: int, sharding):
    """The global [global_batch, seq_len + 1] int32 array starting at sequence ``position``,
    each process filling only its own devices' rows."""
    import jax

    def local(index: tuple[slice, ...] | None) -> np.ndarray:
        assert index is not None  # a sharded array's shard index
        start, stop, _ = index[0].indices(global_batch)
        return source(position + start, stop - start)[:, index[1]]

    return jax.make_array_from_callback((global_batch, seq_len + 1), sharding, local)
