"""Write quantization results to files, atomically and never over the user's data.

- ``.npy``: the dequantized values ``x_q`` of one tensor, written chunk by chunk into a
  memory-mapped temporary file: float32, or float64 for float64 data under ``--product
  exact`` (whose x_q float32 may not hold, e.g. 1e-300).
- ``.npz`` / ``.safetensors``: for every tensor ``<key>.codes`` (the raw element codes,
  uint8 for formats of up to 8 bits) and ``<key>.scales`` (one per tile, in the direction
  ``x_q = decode(codes) / scales``; float32, or float64 where float32 cannot hold the
  scales of ``--product exact``).  The scales' grid tiles the tensor's matrix view
  (``stream.matrix_shape``); the metadata records per tensor the scheme, the tile, the
  shape and that view (``matrix``: [rows, columns]): a .safetensors header's
  ``__metadata__``, the same JSON object as the uint8 bytes of a .npz's member
  ``__metadata__`` (``inputs.layouts.fmt_out`` reads both back).

The one .safetensors writer is ``SafetensorsStream``: the header first, from each tensor's
name, dtype code and shape, then each tensor's bytes as it is made (``write_safetensors``
for arrays already in memory, ``stream_safetensors`` for tensors made one at a time, and
``quantize.layout_out``'s checkpoint folders all go through it).

Every file is written to a temporary name (``.fmtcli-*``) in the target directory and
renamed into place when complete; a write that fails for any reason (disk full, an
exception midway) removes its temporary and says why in one line.  The target is checked
before any work: an existing file is replaced only with ``force``; a directory, a path
whose parent is not a directory, or a directory we cannot create files in is refused; an
input is never a target.  A symbolic link as the target is refused without ``force``; with
``force`` the link itself is replaced by the new file (what it pointed to is left alone).
"""

from __future__ import annotations

import errno
import json
import math
import os
import struct
import tempfile

import numpy as np

from fmtcli.base.dtypes import ITEMSIZES, SAFETENSORS_CODES, SAFETENSORS_NAMES
from fmtcli.base.errors import DataError, Param, UsageError, shown
from fmtcli.inputs.layouts.fmt_out import MARKER, MARKER_KEY, NPZ_METADATA
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import encode
from fmtcli.streaming.stream import matrix_shape

OUT_SUFFIXES = (".npy", ".npz", ".safetensors")
#: The most bytes of a tensor copied into memory at once by ``SafetensorsStream``.
COPY_BYTES = 64 << 20


def check_target(path: str, inputs: list[str], force: bool) -> str:
    """Validate an output path before any work: known suffix, not an input, not a directory,
    no clobbering, a directory we can create the temporary in."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in OUT_SUFFIXES:
        raise UsageError(Param("out", path) + ": an output file must end in "
                         + ", ".join(OUT_SUFFIXES))
    if among(path, inputs):
        raise UsageError(Param("out", path) + " is one of the inputs; refusing to overwrite it")
    if os.path.isdir(path):
        raise UsageError(Param("out", path) + " is a directory", "give a file name in it")
    if os.path.islink(path) and not force:
        raise UsageError(Param("out", path) + " is a symbolic link",
                         "pass " + Param("force", True) + " to replace the link itself; its "
                         "target is left alone")
    if os.path.lexists(path) and not force:
        raise UsageError(f"{shown(path)} exists", "pass " + Param("force", True) + " to replace it")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise UsageError("the directory of " + Param("out", path)
                         + f", {shown(directory)}, {what}")
    os.unlink(_temporary(path))  # can we create files there at all? (root ignores modes)
    return suffix


def _temporary(path: str) -> str:
    """A new empty temporary file beside ``path`` (same directory, so the rename is atomic)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        handle, name = tempfile.mkstemp(prefix=".fmtcli-", suffix=os.path.splitext(path)[1],
                                        dir=directory)
    except OSError as error:
        raise DataError(f"cannot write {shown(path)}: cannot create a file in "
                        f"{shown(directory)} ({error.strerror or error})") from None
    os.close(handle)
    return name


def _remove(temporary: str) -> None:
    try:
        os.unlink(temporary)
    except FileNotFoundError:
        pass


def creation_mode(base: int = 0o666) -> int:
    """The mode a new file (``base`` 0o666) or folder (0o777) gets under the process's
    umask (0644 / 0755 under the usual 022), for what was made by ``mkstemp`` / ``mkdtemp``
    (0600 / 0700).  The umask is read by setting it and putting it back at once."""
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def _commit(temporary: str, path: str) -> None:
    """Give the file the mode a new file gets (mkstemp's is 0600), then rename into place
    (over a symbolic link: the link is replaced, not its target).  On failure the temporary
    is removed and the reason is a DataError."""
    try:
        os.chmod(temporary, creation_mode())
        if os.path.isdir(path) and not os.path.islink(path):
            raise IsADirectoryError(21, "Is a directory")  # appeared since check_target
        os.replace(temporary, path)
    except OSError as error:
        _remove(temporary)
        raise DataError(f"cannot write {shown(path)} ({error.strerror or error})") from None


def check_not_an_input(path: str, sources) -> None:
    """Refuse a target that is one of the tensors' files (e.g. found in an input folder)."""
    if among(path, [source.source for source in sources]):
        raise UsageError(Param("out", path) + " is one of the inputs; refusing to overwrite it")


def among(target: str, paths, inside: bool = False) -> bool:
    """Whether one of ``paths`` (as given; ``-`` and paths that do not exist are skipped)
    is ``target`` itself or, with ``inside``, lies anywhere in the folder ``target``, links
    resolved: the one test that an output would overwrite an input."""
    real_target = os.path.realpath(target)
    for item in paths:
        if item == "-" or not os.path.exists(item):
            continue
        real = os.path.realpath(item)
        if real == real_target or (inside and real.startswith(real_target + os.sep)):
            return True
    return False


def output_names(sources) -> list[str]:
    """A distinct name per tensor for the codes/scales file: its key, or its file's stem;
    names that repeat across inputs get the file's stem in front, then a counter."""
    def stem(source) -> str:
        return os.path.splitext(os.path.basename(source.source))[0] or "tensor"

    names = [source.key or stem(source) for source in sources]
    repeated = {name for name in names if names.count(name) > 1}
    names = [f"{stem(s)}.{n}" if n in repeated and s.key else n for s, n in zip(sources, names)]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}.{seen[name]}")
    return unique


def codes_of(values: np.ndarray, spec: FormatSpec) -> np.ndarray:
    """Element codes of values already on the format's grid (ml_dtypes where it has it)."""
    dtype = spec.ml_dtype
    if dtype is None:
        return encode(values, spec)
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[dtype.itemsize]
    return np.ascontiguousarray(values).astype(dtype).view(width)


def _reserve(path: str) -> None:
    """Allocate the memory-mapped file's blocks now: a full disk is then an error here, not
    a SIGBUS when a page of the map is first written.  Filesystems without fallocate skip."""
    if not hasattr(os, "posix_fallocate"):
        return
    with open(path, "r+b") as handle:
        size = os.fstat(handle.fileno()).st_size
        try:
            os.posix_fallocate(handle.fileno(), 0, size)
        except OSError as error:
            if error.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                return
            raise


class NpyWriter:
    """Streams one tensor's dequantized values into a .npy (temporary until ``close``; a
    failure at any step removes the temporary: ``abort`` for the caller's own failures)."""

    def __init__(self, path: str, shape: tuple[int, ...], dtype=np.float32) -> None:
        self.path = path
        self.temporary = _temporary(path)
        try:
            self.array = np.lib.format.open_memmap(self.temporary, mode="w+",
                                                   dtype=dtype, shape=shape)
            _reserve(self.temporary)
        except (OSError, ValueError) as error:
            self.abort()
            reason = getattr(error, "strerror", None) or error
            raise DataError(f"cannot write {shown(path)} ({reason})") from None
        # the chunks come as parts of the tensor's matrix view (``stream.matrix_shape``)
        self.matrix = self.array.reshape(matrix_shape(shape))

    def write(self, rows: slice, cols: slice, values: np.ndarray) -> None:
        try:
            # a value beyond the file's float32 range (a format reaching past float32's
            # max, e8m4fn) is written as inf, without numpy's overflow warning
            with np.errstate(over="ignore"):
                self.matrix[rows, cols] = values
        except OSError as error:
            self.abort()
            raise DataError(f"cannot write {shown(self.path)} ({error.strerror or error})"
                            ) from None

    def close(self) -> None:
        try:
            self.array.flush()
            del self.matrix, self.array
        except OSError as error:
            _remove(self.temporary)
            raise DataError(f"cannot write {shown(self.path)} ({error.strerror or error})"
                            ) from None
        _commit(self.temporary, self.path)

    def abort(self) -> None:
        self.__dict__.pop("matrix", None)
        self.__dict__.pop("array", None)
        _remove(self.temporary)


def _scales_array(scales) -> np.ndarray:
    """Scales as stored: float32, unless float32 cannot hold them exactly (float64 scales of
    ``--product exact``, e.g. 448 / 1e-300), then float64, so that
    ``x_q = decode(codes) / scales`` stays true of the file."""
    s = np.asarray(scales)
    with np.errstate(over="ignore", under="ignore"):
        s32 = s.astype(np.float32)
    if s.dtype == np.float64 and not np.array_equal(s32.astype(np.float64), s, equal_nan=True):
        return np.ascontiguousarray(s)
    return np.ascontiguousarray(s32)


def write_codes(path: str, tensors: list[tuple[str, np.ndarray, np.ndarray, dict]]) -> None:
    """Write (key, codes, scales, description) per tensor to .npz or .safetensors."""
    arrays: dict[str, np.ndarray] = {}
    metadata: dict[str, str] = {MARKER_KEY: MARKER}
    for key, codes, scales, description in tensors:
        arrays[f"{key}.codes"] = np.ascontiguousarray(codes)
        arrays[f"{key}.scales"] = _scales_array(scales)
        metadata[key] = json.dumps(description)
    if path.lower().endswith(".npz"):  # .npz has no header: the same JSON as a uint8 member
        arrays[NPZ_METADATA] = np.frombuffer(json.dumps(metadata).encode("utf-8"), np.uint8)

        def write(temporary: str) -> None:
            with open(temporary, "wb") as handle:
                np.savez(handle, **arrays)

        write_atomically(path, write)
    else:
        write_safetensors(path, arrays, metadata)


def write_atomically(path: str, write) -> None:
    """The one way a whole file is written: ``write(temporary)`` fills a new temporary
    beside ``path``, which is then renamed into place with the mode a new file gets
    (0666 less the umask: 0644 under the usual umask 022, not mkstemp's 0600).  An OSError
    is a one-line DataError and anything else (a bug, Ctrl-C) is re-raised; either way the
    temporary is removed."""
    temporary = _temporary(path)
    try:
        write(temporary)
    except OSError as error:
        _remove(temporary)
        raise DataError(f"cannot write {shown(path)} ({error.strerror or error})") from None
    except BaseException:  # anything else (a bug, Ctrl-C): no temporary left behind
        _remove(temporary)
        raise
    _commit(temporary, path)


def write_bytes(path: str, data: bytes) -> None:
    """``data`` as the whole file ``path``, atomically (``write_atomically``)."""
    def write(temporary: str) -> None:
        with open(temporary, "wb") as handle:
            handle.write(data)

    write_atomically(path, write)


def write_safetensors(path: str, arrays: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
    """``arrays`` (name -> array of a dtype in ``dtypes.SAFETENSORS_CODES``) as a
    .safetensors file, atomically; no ``safetensors`` package needed (the format: an
    8-byte little-endian header length, the JSON header, the raw bytes)."""
    write_atomically(path, lambda temporary: _write_safetensors(
        temporary, {k: np.asarray(a, order="C") for k, a in arrays.items()}, metadata or {}))


def _write_safetensors(path: str, arrays: dict[str, np.ndarray], metadata: dict) -> None:
    entries = [(key, SAFETENSORS_CODES[arr.dtype.name], arr.shape)
               for key, arr in arrays.items()]
    with open(path, "wb") as handle:
        stream = SafetensorsStream(handle, entries, metadata)
        for key, arr in arrays.items():
            stream.write(key, arr)
        stream.close()


def safetensors_header(entries, metadata: dict | None = None) -> bytes:
    """The front of a .safetensors holding ``entries`` ((name, safetensors dtype code,
    shape) each, in the order their bytes follow): the 8-byte little-endian length, then
    the JSON header (``__metadata__`` first where there is any), padded with spaces so that
    the data starts 8-aligned (as safetensors' own writer keeps it)."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, code, shape in entries:
        size = math.prod(shape) * ITEMSIZES[SAFETENSORS_NAMES[code]]
        header[name] = {"dtype": code, "shape": [int(n) for n in shape],
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode("utf-8")
    raw += b" " * ((-len(raw)) % 8)
    return struct.pack("<Q", len(raw)) + raw


class SafetensorsStream:
    """One .safetensors written into an open binary file as its tensors are made: the
    header first, from ``entries`` ((name, safetensors dtype code, shape) each), then each
    tensor's bytes (``write``, in the entries' order), little-endian, in pieces of at most
    ``COPY_BYTES`` (a memory map is not copied whole).  Only one tensor need be in memory
    at a time.  ``close`` checks that every entry was written.  A tensor that is not the
    next entry (another name, shape or size) is a bug: RuntimeError."""

    def __init__(self, handle, entries, metadata: dict | None = None) -> None:
        self.handle = handle
        self.entries = [(name, code, tuple(int(n) for n in shape))
                        for name, code, shape in entries]
        self.done = 0
        handle.write(safetensors_header(self.entries, metadata))

    def write(self, name: str, data: np.ndarray) -> None:
        if self.done >= len(self.entries):
            raise RuntimeError(f"safetensors stream: {name!r} is past the last entry")
        want, code, shape = self.entries[self.done]
        size = math.prod(shape) * ITEMSIZES[SAFETENSORS_NAMES[code]]
        if (name, shape, size) != (want, tuple(data.shape), data.nbytes):
            raise RuntimeError(f"safetensors stream: got {name!r} {list(data.shape)} "
                               f"({data.nbytes} bytes) where the header has {want!r} "
                               f"{list(shape)} ({size} bytes)")
        flat = data.reshape(-1)
        if flat.dtype.byteorder == ">":
            flat = flat.byteswap()
        step = max(1, COPY_BYTES // max(1, flat.itemsize))
        for start in range(0, flat.size, step):
            self.handle.write(np.ascontiguousarray(flat[start:start + step]).tobytes())
        self.done += 1

    def close(self) -> None:
        if self.done != len(self.entries):
            raise RuntimeError(f"safetensors stream: {len(self.entries) - self.done} of "
                               f"{len(self.entries)} tensors not written")


def stream_safetensors(path: str, entries, tensors, metadata: dict | None = None) -> None:
    """A .safetensors at ``path`` streamed from ``tensors`` (an iterable of (name, array)
    in ``entries``' order, made one at a time: ``SafetensorsStream``), atomically
    (``write_atomically``: a temporary beside ``path``, renamed when complete, removed on
    any failure)."""
    def write(temporary: str) -> None:
        with open(temporary, "wb") as handle:
            stream = SafetensorsStream(handle, entries, metadata)
            for name, data in tensors:
                stream.write(name, data)
            stream.close()

    write_atomically(path, write)
