"""Read .npy files and .npz archives without trusting a byte of them.

numpy's own reader is not used on user files: it reads a header of any declared length
(0xFFFFFFF0 bytes allocates until MemoryError), and ``np.load`` of a compressed .npz member
inflates it whole.  Here:

- the header is at most ``MAX_HEADER_BYTES`` (numpy writes a few hundred; its own
  ``max_header_size`` default is 10,000) and is parsed with ``ast.literal_eval`` as numpy
  does; its shape is checked (non-negative ints, at most 64 dimensions) and the data size
  ``prod(shape) * itemsize`` is computed with Python ints and compared with what the file or
  member holds *before* anything is mapped or read;
- a .npy file and an uncompressed (stored) .npz member are memory-mapped; a stored member's
  CRC-32 is checked (one streaming pass) the first time it is opened;
- a compressed member is inflated chunk by chunk (its CRC checked by ``zipfile`` at the end),
  never past the size its header declares and the zip directory confirms: in memory up to
  ``INFLATE_IN_MEMORY`` bytes, above that into an unlinked temporary file that is mapped, so
  a member that inflates to GiBs does not take GiBs of RAM.

bfloat16 saved by ``np.save`` from ml_dtypes is recorded as the descriptor ``'<V2'``
(``'>V2'`` when the array is big-endian).  numpy writes its own 2-byte void type as
``'|V2'``, and the only 2-byte type ml_dtypes registers is bfloat16, so ``'<V2'`` and
``'>V2'`` are read as bfloat16 in that byte order (readers swap it: ``streaming.stream``),
mapped as its bit patterns (``storage.BFLOAT16_BITS``), so that reading it does not import
ml_dtypes (``storage``).
ml_dtypes' 1-byte types (every float8, float6, float4 and int4 variant) are all recorded
as ``'<V1'`` (float8_e5m2 as ``'<f1'``): the file does not say which one, so such a
tensor is skipped with a note on how to convert it.
"""

from __future__ import annotations

import ast
import math
import mmap
import os
import shutil
import struct
import tempfile
import weakref
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fmtcli.base.errors import DataError, shown
from fmtcli.inputs.storage import BFLOAT16_BITS

MAGIC = b"\x93NUMPY"
MAX_HEADER_BYTES = 1 << 20
MAX_DIMS = 64  # numpy's limit
INFLATE_IN_MEMORY = 64 << 20
_CHUNK = 16 << 20
_UNKNOWN_1_BYTE = ("an ml_dtypes 1-byte type (float8, float6, float4 or int4) saved by np.save, "
                   "which does not record which one: save it as float32 (x.astype(np.float32))"
                   " or write .safetensors")
# what zipfile may raise on a damaged archive or member
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError,
              struct.error, NotImplementedError, OverflowError, zlib.error)


@dataclass
class Entry:
    """One array of a .npy/.npz: its shape and dtype, and an opener or why it is skipped."""

    key: str | None
    shape: tuple[int, ...]
    dtype: np.dtype | str
    opener: Callable[[], np.ndarray] | None
    skipped: str | None = None


@dataclass
class Header:
    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype | None  # None: not a dtype this program can read (``skipped`` says why)
    skipped: str | None
    data_offset: int  # from the first magic byte to the first data byte

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def order(self) -> str:
        return "F" if self.fortran else "C"


def _read_exactly(handle, size: int, where: str, what: str) -> bytes:
    data = handle.read(size)
    if len(data) < size:
        raise DataError(f"{where}: truncated ({what} cut short)")
    return data


def read_header(handle, where: str) -> Header:
    """The header of the .npy data that starts at ``handle``'s position (a file or a zip
    member stream); ``where`` names it, quoted, in messages."""
    magic = handle.read(len(MAGIC))
    if magic != MAGIC:
        raise DataError(f"{where}: not a .npy file (it does not start with numpy's magic bytes)")
    major, minor = _read_exactly(handle, 2, where, "the format version")
    if major not in (1, 2, 3) or minor != 0:
        raise DataError(f"{where}: unknown .npy format version {major}.{minor}")
    width = 2 if major == 1 else 4
    length = int.from_bytes(_read_exactly(handle, width, where, "the header length"), "little")
    if length > MAX_HEADER_BYTES:
        raise DataError(f"{where}: corrupt .npy header (it declares {length:,} bytes of header;"
                        f" numpy writes a few hundred)")
    raw = _read_exactly(handle, length, where, "the header")
    try:
        fields = ast.literal_eval(raw.decode("latin1" if major < 3 else "utf-8"))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise DataError(f"{where}: corrupt .npy header (not a Python dict literal)") from None
    if not (isinstance(fields, dict) and set(fields) == {"descr", "fortran_order", "shape"}):
        raise DataError(f"{where}: corrupt .npy header (it must hold exactly descr, "
                        "fortran_order and shape)")
    shape, fortran = fields["shape"], fields["fortran_order"]
    if not (isinstance(shape, tuple) and len(shape) <= MAX_DIMS and isinstance(fortran, bool)
            and all(type(d) is int and 0 <= d < 2 ** 63 for d in shape)):
        raise DataError(f"{where}: corrupt .npy header (shape must be at most {MAX_DIMS} "
                        "non-negative integers, fortran_order True or False)")
    dtype, skipped = _dtype_from_descr(fields["descr"], where)
    if dtype is not None and dtype.subdtype is not None:  # '(3,)<f4': numpy appends (3,)
        dtype, shape = dtype.subdtype[0], shape + dtype.subdtype[1]
        if dtype.hasobject or len(shape) > MAX_DIMS:
            raise DataError(f"{where}: corrupt .npy header (unreadable subarray dtype)")
    return Header(shape, fortran, dtype, skipped, len(MAGIC) + 2 + width + length)


def _dtype_from_descr(descr, where: str) -> tuple[np.dtype | None, str | None]:
    if descr in ("<V2", ">V2"):  # bfloat16; '>V2' from x.astype(bfloat16 big-endian)
        return BFLOAT16_BITS.newbyteorder(descr[0]), None  # its bits: no ml_dtypes import
    if descr in ("<V1", "<f1"):
        return None, f"dtype {descr!r} is {_UNKNOWN_1_BYTE}"
    try:
        try:
            dtype = np.lib.format.descr_to_dtype(descr)
        except TypeError:  # a name ml_dtypes registers (imported only when needed: 5 ms)
            import ml_dtypes  # noqa: F401  (registers its dtypes with numpy)

            dtype = np.lib.format.descr_to_dtype(descr)
    except Exception:  # any literal can reach numpy's parser; none may escape as a crash
        text = repr(descr)
        text = text if len(text) <= 40 else text[:40] + "..."
        return None, f"dtype descriptor {text} is not one numpy knows"
    if dtype.hasobject:
        raise DataError(f"{where}: holds Python objects, which fmtcli never unpickles")
    if dtype.names:
        return None, "a structured dtype (fields), not a plain array of numbers"
    return dtype, None


def memory_map(path: str, dtype: np.dtype, offset: int, shape: tuple[int, ...],
               order: str = "C") -> np.ndarray:
    """A read-only map of data whose size was checked at load time; a file that has shrunk
    or vanished since is a data error, not numpy's ValueError."""
    try:
        return np.memmap(path, dtype, "r", offset, shape, order)
    except (ValueError, OSError) as error:
        raise DataError(f"{shown(path)}: cannot map its data (the file changed or shrank "
                        f"after it was opened? {error})") from None


def _entry(key: str | None, header: Header, opener) -> Entry:
    if header.dtype is None:
        return Entry(key, header.shape, "unknown", None, header.skipped)
    return Entry(key, header.shape, header.dtype, opener)


# -- .npy ------------------------------------------------------------------------------------------

def load_npy(path: str) -> list[Entry]:
    """The array of a .npy file, memory-mapped (read-only) when it is opened."""
    where = shown(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            header = read_header(handle, where)
    except OSError as error:
        raise DataError(f"{where}: cannot read ({error.strerror or error})") from None
    if header.dtype is not None and header.data_offset + header.nbytes > size:
        raise DataError(f"{where}: truncated or wrong size (its header declares "
                        f"{header.nbytes:,} bytes of data, the file holds "
                        f"{max(size - header.data_offset, 0):,})")

    def opener() -> np.ndarray:
        return memory_map(path, header.dtype, header.data_offset, header.shape, header.order)

    return [_entry(None, header, opener)]


# -- .npz ------------------------------------------------------------------------------------------

def load_npz(path: str) -> list[Entry]:
    """Every ``*.npy`` member of a .npz archive (other members are ignored)."""
    where = shown(path)
    entries, seen = [], set()
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.is_dir() or not info.filename.endswith(".npy"):
                    continue
                key = info.filename[:-4]
                if key in seen:
                    raise DataError(f"{where}: two members are named {shown(info.filename)}")
                seen.add(key)
                entries.append(_member(path, archive, info, key))
    except ZIP_ERRORS as error:
        raise DataError(f"{where}: not a readable .npz file ({_zip_reason(error)})") from None
    return entries


def _zip_reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    if isinstance(error, NotImplementedError):
        return "a compression method zipfile does not support"
    if isinstance(error, (EOFError, struct.error)):
        return "truncated"
    if "CRC" in str(error):
        return "its CRC-32 does not match the archive's directory"
    return "damaged zip structure or compressed data"


def _member(path: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo, key: str) -> Entry:
    where = f"{shown(path)} member {shown(key)}"
    if info.flag_bits & 0x1:
        raise DataError(f"{where} is encrypted")
    if info.compress_type == zipfile.ZIP_STORED:
        start = _stored_data_start(path, info, where)
        with open(path, "rb") as handle:
            handle.seek(start)
            header = read_header(handle, where)
    else:
        start = None
        try:
            with archive.open(info) as member:
                header = read_header(member, where)
        except ZIP_ERRORS as error:  # a small member is read to its end: CRC checked
            raise DataError(f"{where}: corrupt ({_zip_reason(error)})") from None
    if header.dtype is not None and header.data_offset + header.nbytes != info.file_size:
        raise DataError(f"{where}: truncated or wrong size (its header declares "
                        f"{header.nbytes:,} bytes of data, the member holds "
                        f"{max(info.file_size - header.data_offset, 0):,})")
    if start is not None:
        if start + info.file_size > os.path.getsize(path):
            raise DataError(f"{where}: truncated (the archive ends inside it)")
        return _entry(key, header, _stored_opener(path, info, start, header, where))
    return _entry(key, header, _inflating_opener(path, info, header, where))


def _stored_data_start(path: str, info: zipfile.ZipInfo, where: str) -> int:
    """Where a stored member's bytes begin: after its local header, name and extra field."""
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        local = handle.read(30)
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise DataError(f"{where}: corrupt (no local zip header where the directory says)")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _stored_opener(path: str, info: zipfile.ZipInfo, start: int, header: Header, where: str):
    checked = []

    def opener() -> np.ndarray:
        if not checked:
            _check_crc(path, start, info.file_size, info.CRC, where)
            checked.append(True)
        offset = start + header.data_offset
        return memory_map(path, header.dtype, offset, header.shape, header.order)

    return opener


def _check_crc(path: str, start: int, length: int, expected: int, where: str) -> None:
    crc = 0
    with open(path, "rb") as handle:
        handle.seek(start)
        while length:
            chunk = handle.read(min(_CHUNK, length))
            if not chunk:
                raise DataError(f"{where}: truncated (the archive ends inside it)")
            crc, length = zlib.crc32(chunk, crc), length - len(chunk)
    if crc != expected:
        raise DataError(f"{where}: corrupt (its CRC-32 does not match the archive's directory)")


def _inflating_opener(path: str, info: zipfile.ZipInfo, header: Header, where: str):
    """Inflates the member on each open, unless the last result is still alive."""
    last: list[weakref.ref] = []

    def opener() -> np.ndarray:
        flat = last[0]() if last else None
        if flat is None:
            try:
                flat = _inflate(path, info, header, where)
            except ZIP_ERRORS as error:
                raise DataError(f"{where}: corrupt ({_zip_reason(error)})") from None
            last[:] = [weakref.ref(flat)]
        return flat.view(header.dtype).reshape(header.shape, order=header.order)

    return opener


def _inflate(path: str, info: zipfile.ZipInfo, header: Header, where: str) -> np.ndarray:
    """The member's data bytes (uint8), read in chunks to the end (so zipfile checks the
    CRC), never more than the header declares."""
    size = header.nbytes
    with zipfile.ZipFile(path) as archive, archive.open(info) as member:
        member.read(header.data_offset)
        if size <= INFLATE_IN_MEMORY:
            flat = np.empty(size, np.uint8)
            view, done = memoryview(flat), 0
            while done < size:
                chunk = member.read(min(_CHUNK, size - done))
                if not chunk:
                    raise EOFError
                view[done:done + len(chunk)] = chunk
                done += len(chunk)
        else:
            flat = _inflate_to_file(member, size, where)
        if member.read(1):
            raise zipfile.BadZipFile("longer than its header declares")
    return flat


def _inflate_to_file(member, size: int, where: str) -> np.ndarray:
    folder = tempfile.gettempdir()
    free = shutil.disk_usage(folder).free
    if free < size:
        raise DataError(f"{where}: inflates to {size / 2**30:.1f} GiB, more than the "
                        f"{free / 2**30:.1f} GiB free in {shown(folder)}",
                        "set TMPDIR, or save with np.savez (uncompressed, memory-mapped)")
    try:
        with tempfile.TemporaryFile(dir=folder) as scratch:  # unlinked: gone when unmapped
            done = 0
            while done < size:
                chunk = member.read(min(_CHUNK, size - done))
                if not chunk:
                    raise EOFError
                scratch.write(chunk)
                done += len(chunk)
            scratch.flush()
            mapped = mmap.mmap(scratch.fileno(), size, access=mmap.ACCESS_READ)
    except OSError as error:
        raise DataError(f"{where}: cannot inflate it into {shown(folder)} "
                        f"({error.strerror or error})") from None
    return np.frombuffer(mapped, np.uint8)
