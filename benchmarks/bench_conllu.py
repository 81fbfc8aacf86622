"""Reading a CoNLL-U file of blank lines (issue 43, item 12): ``python -m benchmarks.bench_conllu``.

A gzipped file of 600 MB of newlines (0.6 MB compressed) after one word: the reader must refuse it at the
decompression cap (512 MB). Printed: the CoNLL-U reader's time; the naive way, a Python loop over the same lines
(``analysis.core.textfiles.open_lines``, what the reader did before: one Python step per line); and the ceiling of
the machine, decompressing the same bytes with zlib and counting the newlines, nothing else."""

from __future__ import annotations

import gzip
import io
import tempfile
import time
import zlib
from pathlib import Path

from analysis.core.inputs import InputError
from analysis.core.textfiles import open_lines
from analysis.core.treebank import read_conllu


def timed(run) -> float:
    start = time.perf_counter()
    try:
        run()
    except InputError:
        pass
    return time.perf_counter() - start


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "blank.conllu.gz"
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9) as g:
            g.write(b"1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n")
            for _ in range(600):
                g.write(b"\n" * (1 << 20))
        path.write_bytes(buffer.getvalue())
        ours = timed(lambda: read_conllu(path))
        naive = timed(lambda: sum(1 for _ in open_lines(path, path.name)))

        def ceiling():
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            data, total = path.read_bytes(), 0
            for start in range(0, len(data), 1 << 16):
                total += d.decompress(data[start:start + (1 << 16)], 1 << 30).count(b"\n")
                if total > 512 << 20:
                    break
        floor = timed(ceiling)
    print(f"{path.name}: {len(buffer.getvalue()):,} bytes gzipped, refused at 512 MB decompressed")
    print(f"read_conllu {ours:.2f} s; a Python loop over its lines {naive:.2f} s ({naive / ours:.1f}x slower); "
          f"zlib alone, counting newlines {floor:.2f} s (the reader at {floor / ours:.0%} of that ceiling)")


if __name__ == "__main__":
    main()
