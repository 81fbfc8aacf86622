"""Text files read one line at a time, with caps, for every reader of user files (:mod:`analysis.core.inputs`: texts
and tables; :mod:`analysis.core.treebank`: CoNLL-U): a file is never held whole, a reader that stops at its
limit reads no further, and a compressed file yields at most ``LAYERLENS_MAX_DECOMPRESSED_MB`` (issue 34.2: a 39 KB
``.txt.gz`` of 20 million one-letter lines took 6.9 GB when read whole). :class:`InputError` (a problem with what a
user gave, its message written for the user) lives here so that every reader can raise it.
"""

from __future__ import annotations

import codecs
import gzip
import io
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

# What one compressed file may yield. Real text compresses 2.7-5.4x (the shared English corpus 2.7-2.9x, UD EWT's
# CoNLL-U 5.4x, measured), so a 50 MB upload (the pages' cap) of real data is at most ~270 MB decompressed: 512 MB
# reads any of them, while a gzip bomb (1000x) stops after 512 MB of streaming, never held.
MAX_DECOMPRESSED_MB = 512
MAX_LINE_BYTES = 8 << 20  # one line (a text, a table row, a CoNLL-U word) longer than this is refused
PEEK_LINES = 1000  # after its limit a reader looks this far for more rows, to say whether the file goes on
BINARY_PROBE = 8192  # a NUL byte in a file's first bytes: binary, not text


class InputError(ValueError):
    """The input cannot be used; the message says why and what to do."""


def setting(name: str, default: int) -> int:
    """A whole-number setting (at least 1) from the environment variable ``name``, else ``default``; anything else is
    an :class:`InputError` naming it."""
    given = os.environ.get(name, "").strip()
    if not given:
        return default
    if not (given.isascii() and given.isdigit()) or int(given) < 1:
        raise InputError(f"{name} must be a whole number of at least 1, got {given!r}")
    return int(given)


def max_decompressed() -> int:
    """Bytes one compressed file may yield: ``LAYERLENS_MAX_DECOMPRESSED_MB`` (default :data:`MAX_DECOMPRESSED_MB`)."""
    return setting("LAYERLENS_MAX_DECOMPRESSED_MB", MAX_DECOMPRESSED_MB) << 20


class _Capped(io.RawIOBase):
    """A decompressing stream that is an :class:`InputError` once more than ``cap`` bytes came out of it."""

    def __init__(self, stream, cap: int, name: str):
        self.stream, self.cap, self.name, self.total = stream, cap, name, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.stream.readinto(buffer)
        self.total += n
        if self.total > self.cap:
            raise InputError(f"{self.name}: more than {self.cap >> 20:,} MB once decompressed, the most one compressed "
                             "file may give (LAYERLENS_MAX_DECOMPRESSED_MB on the server raises it); a smaller row "
                             "limit reads less")
        return n


CSV_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")  # the lines the csv module counts (newline="")
BLOCK = 1 << 20  # bytes read at a time


def open_blocks(source: Path | bytes | str, name: str) -> Iterator[str]:
    """The text of a file (``Path``), of an upload held in memory (``bytes``) or of typed text (``str``), a block
    of whole lines at a time (about 1 MB; only the last may lack its ``\\n``), decoded as UTF-8 (a leading BOM
    dropped) and decompressed when ``name`` ends in ``.gz`` (at most :func:`max_decompressed` bytes). Every
    reader of text files streams through this (:func:`open_lines`), so none holds a file whole and one that stops
    at its limit reads no further; lines are split in blocks, so that millions of short lines cost little.
    Problems are one-line :class:`InputError` s naming ``name``: a missing file, a NUL byte in the first 8 KB
    (binary), bytes that are not UTF-8 (with the line), a line over 8 MB, a damaged gzip stream, the cap."""
    try:
        raw = open(source, "rb") if isinstance(source, Path) else io.BytesIO(
            source.encode("utf-8", "surrogatepass") if isinstance(source, str) else source)
    except FileNotFoundError:
        raise InputError(f"no such file: {source}") from None
    except IsADirectoryError:
        raise InputError(f"{source} is a folder, not a file") from None
    except OSError as exc:
        raise InputError(f"cannot read {source}: {exc.strerror or exc}") from None
    with raw:
        stream = raw
        if name.lower().endswith(".gz"):
            stream = io.BufferedReader(_Capped(gzip.GzipFile(fileobj=raw, mode="rb"), max_decompressed(), name),
                                       1 << 16)
        carry, before, first = b"", 0, True  # the unfinished line, the lines before it, the first block to come
        while True:
            try:
                chunk = stream.read(BLOCK)
            except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError; a cut file, EOFError
                raise InputError(f"{name} cannot be read: a damaged or cut gzip file ({type(exc).__name__})") from None
            if first:
                chunk = chunk.removeprefix(codecs.BOM_UTF8)
                if not isinstance(source, str) and b"\x00" in chunk[:BINARY_PROBE]:  # typed text is text
                    raise InputError(f"{name} looks like a binary file, not text")
                first = False
            data = carry + chunk
            cut = data.rfind(b"\n") + 1 if chunk else len(data)
            whole, carry = data[:cut], data[cut:]
            if len(carry) > MAX_LINE_BYTES:
                line = before + whole.count(b"\n") + 1
                raise InputError(f"{name}, line {line}: longer than "
                                 f"{MAX_LINE_BYTES >> 20} MB, the longest line LayerLens reads (a text, a row or a "
                                 "CoNLL-U word per line)")
            if whole:
                try:
                    yield whole.decode("utf-8")
                except UnicodeDecodeError as exc:
                    line = before + whole.count(b"\n", 0, exc.start) + 1
                    at = exc.start - whole.rfind(b"\n", 0, exc.start) - 1
                    raise InputError(f"{name}, line {line}: not UTF-8 text (bad byte at position {at} of the line); "
                                     "save it as UTF-8") from None
                before += whole.count(b"\n")
            if not chunk:
                return


def open_lines(source: Path | bytes | str, name: str, csv_lines: bool = False) -> Iterator[str]:
    """The lines of :func:`open_blocks`, one at a time, without their ``\\n`` (``\\r\\n``); with ``csv_lines`` they
    keep their ends and a lone ``\\r`` ends one too, as the csv module reads them (``newline=""``)."""
    blocks = open_blocks(source, name)
    try:
        for block in blocks:
            if csv_lines:
                yield from CSV_LINE.findall(block)
            else:
                block = block.replace("\r\n", "\n")
                yield from (block[:-1] if block.endswith("\n") else block).split("\n")
    finally:
        blocks.close()


_FAILED = object()


class Lines:
    """:func:`open_lines` one line ahead, for the readers here: ``number`` (lines read), ``at_end`` (the last line
    has been read: a CSV quote left open there swallowed the rest), ``record`` (the lines of the CSV record being
    read) and :meth:`goes_on` (whether rows follow a reader's limit)."""

    def __init__(self, source: Path | bytes | str, name: str, csv_lines: bool = False):
        self._lines = open_lines(source, name, csv_lines)
        self.number, self._error = 0, None
        self.record: list[str] | None = [] if csv_lines else None
        self._advance()

    def _advance(self) -> None:
        try:
            self._next = next(self._lines, None)
        except InputError as exc:  # raised when that line is asked for, not before
            self._next, self._error = _FAILED, exc

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = self._next
        if line is None:
            raise StopIteration
        if line is _FAILED:
            raise self._error
        self._advance()
        self.number += 1
        if self.record is not None:
            self.record.append(line)
        return line

    @property
    def at_end(self) -> bool:
        return self._next is None

    def goes_on(self) -> bool:
        """Whether anything but blank lines comes next, looking at most :data:`PEEK_LINES` lines further (a
        file that goes on past them, or cannot be read further, counts as going on)."""
        try:
            for _ in range(PEEK_LINES):
                if next(self).strip():
                    return True
        except StopIteration:
            return False
        except InputError:
            return True
        return not self.at_end

    def close(self) -> None:
        self._lines.close()


def is_empty(source: Path | bytes | str, name: str) -> bool:
    """Whether ``source`` holds nothing but white space (reading only up to its first text)."""
    blocks = open_blocks(source, name)
    try:
        return not any(block.strip() for block in blocks)
    finally:
        blocks.close()
