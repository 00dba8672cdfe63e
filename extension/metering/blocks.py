"""Where the bytes of metering's sealed chunks are kept: blocks in memory, or in a spill file.

A sealed chunk (``series.py``) is a kilobyte or two, written once and read now and then. They
are written one after the other into blocks of ``BLOCK`` bytes: one long-lived allocation per
block instead of one per chunk (chunks made among the loop's passing allocations would leave the
C heap's pages around them partly used, so never given back).

``MemoryBlocks`` keeps each block as a ``bytearray``, freed when no chunk refers to it any more
(unit tests, tools: a ledger without a directory). ``SpillFile`` keeps them in an unnamed file
(``O_TMPFILE``) of the service's own state directory: the window of full-resolution history
(``c.Metering.full_resolution``, 7 days) then costs the service's memory nothing per job
(docs/service.md "Memory over 100,000 jobs"); the kernel's page cache holds what is read often.
A chunk is read back with one ``pread``. Each file block counts the chunks in it; when the last
one is gone (compaction, retention, a late change that unseals it) the block is written over
again, lowest first. A chunk that cannot be written (the disk full) is kept in memory instead.

The file has no name, so no other process can open it, and it goes with the service's last
descriptor; the directory must be the service's own (owned by it, writable by no one else), or
the blocks stay in memory.
"""

from __future__ import annotations

import heapq
import logging
import os
import stat
import tempfile
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Protocol

BLOCK = 256 * 1024

log = logging.getLogger(__name__)


class Block(Protocol):
    """One block: a chunk reads its bytes from it and says when it is gone."""

    def read(self, at: int, size: int) -> bytes | memoryview: ...

    def release(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Placed:
    """Where ``put`` wrote a chunk's bytes: its block, and the offset in it."""

    block: Block
    at: int


class Blocks(Protocol):
    def put(self, data: bytes) -> Placed: ...


class _MemoryBlock:
    __slots__ = ("data",)

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)

    def read(self, at: int, size: int) -> memoryview:
        return memoryview(self.data)[at : at + size]

    def release(self) -> None:
        """Nothing to do: the block goes with the last chunk that refers to it."""


class MemoryBlocks:
    """Blocks as ``bytearray`` objects (the default, and where a spill file is not to be had)."""

    def __init__(self) -> None:
        self.block = _MemoryBlock(BLOCK)
        self.fill = 0
        self.lock = threading.Lock()  # ledgers of other threads (tests, tools) share it

    def put(self, data: bytes) -> Placed:
        """Write ``data`` after the last chunk's (in a block of its own if it is bigger)."""
        with self.lock:
            if self.fill + len(data) > len(self.block.data):
                self.block, self.fill = _MemoryBlock(max(BLOCK, len(data))), 0
            at = self.fill
            self.block.data[at : at + len(data)] = data
            self.fill += len(data)
            return Placed(self.block, at)


MEMORY = MemoryBlocks()  # shared by every ledger that has no spill file


class _FileBlock:
    """Block ``index`` of a spill file, at ``index * block_size``; ``live``: the chunks in it."""

    __slots__ = ("spill", "index", "live")

    def __init__(self, spill: SpillFile, index: int) -> None:
        self.spill, self.index, self.live = spill, index, 0

    def read(self, at: int, size: int) -> bytes:
        return self.spill.read(self.index * self.spill.block_size + at, size)

    def release(self) -> None:
        # counted at the next put, under its lock: a chunk may be freed anywhere, even inside
        # a put of the same thread (a collection), where taking the lock again would deadlock
        self.spill.released.append(self)


class SpillFile:
    """Blocks in an unnamed file of ``directory`` (see the module docstring); ``open`` makes
    one, or says why not."""

    def __init__(self, fd: int, block_size: int = BLOCK) -> None:
        self.fd = fd
        self.block_size = block_size
        self.lock = threading.Lock()
        self.released: deque[_FileBlock] = deque()  # chunks gone since the last put
        self.free: list[int] = []  # blocks no chunk is in (a heap: the lowest reused first)
        self.blocks = 0  # how many the file has room for
        self.block = self._new_block()
        self.fill = 0
        self.failed: OSError | None = None  # the last write that could not be made
        weakref.finalize(self, os.close, fd)

    @classmethod
    def open(cls, directory: str | os.PathLike[str], block_size: int = BLOCK) -> SpillFile:
        """A spill file in ``directory``, which must be private to this process's user; raises
        ``OSError`` (``PermissionError`` when it is not private) otherwise."""
        # a link is followed (the service's state_dir may be one, as the admin set it up): the
        # directory it opens is the one checked and the one the file is made in
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise PermissionError(f"{directory} is not private to this service's user")
            return cls(_unnamed_file(fd), block_size)
        finally:
            os.close(fd)

    @property
    def size(self) -> int:
        """Bytes the file takes (blocks written, free ones included)."""
        return self.blocks * self.block_size

    def _new_block(self) -> _FileBlock:
        if self.free:
            return _FileBlock(self, heapq.heappop(self.free))
        self.blocks += 1
        return _FileBlock(self, self.blocks - 1)

    def _count_released(self) -> None:
        while self.released:
            block = self.released.popleft()
            block.live -= 1
            if block.live:
                continue
            if block is self.block:
                self.fill = 0  # nothing in it any more: written over from its start
            else:
                heapq.heappush(self.free, block.index)

    def put(self, data: bytes) -> Placed:
        """Write ``data`` after the last chunk's; in memory if it is bigger than a block or the
        write fails."""
        with self.lock:
            self._count_released()
            if len(data) > self.block_size:
                return MEMORY.put(data)
            if self.fill + len(data) > self.block_size:
                old, self.block, self.fill = self.block, self._new_block(), 0
                if not old.live:
                    heapq.heappush(self.free, old.index)
            at = self.fill
            try:
                _write_all(self.fd, data, self.block.index * self.block_size + at)
            except OSError as err:
                if self.failed is None:
                    log.warning("metering keeps its history in memory: %s", err)
                self.failed = err
                return MEMORY.put(data)
            self.block.live += 1
            self.fill += len(data)
            return Placed(self.block, at)

    def read(self, offset: int, size: int) -> bytes:
        data = os.pread(self.fd, size, offset)
        if len(data) != size:
            raise OSError(f"metering's spill file ended {size - len(data)} bytes short")
        return data


def _unnamed_file(directory_fd: int) -> int:
    """A new file with no name in the directory open as ``directory_fd``, for reading and
    writing by this process only."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(".", flags | os.O_TMPFILE, 0o600, dir_fd=directory_fd)
    except (OSError, AttributeError):  # no O_TMPFILE here: a name of its own, gone at once
        with tempfile.TemporaryFile(dir=f"/proc/self/fd/{directory_fd}") as f:
            return os.dup(f.fileno())


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
