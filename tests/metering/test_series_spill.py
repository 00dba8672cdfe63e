"""Sealed chunks kept in the service's spill file (``blocks.py``; issue 31): every reading is
the same as of a series kept whole, freed blocks are written over, the file has no name and is
made only in a directory private to the service, and a chunk that cannot be written stays in
memory."""

from __future__ import annotations

import errno
import os
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from traitlets import Unicode
from traitlets.config import Configurable

from extension.metering import blocks as blocks_module
from extension.metering import series as series_module
from extension.metering.accounting import Ledger
from extension.metering.blocks import BLOCK, MEMORY, Placed, SpillFile
from extension.metering.meter import Metering
from extension.metering.series import StepSeries

from .test_series_memory import BUCKET, OPS, PROBES, SIZES, _history, sealing

SMALL = 512  # bytes a block: a few chunks of three points each, so blocks fill and free often


@pytest.fixture(scope="module")
def spill(tmp_path_factory: pytest.TempPathFactory) -> SpillFile:
    directory = tmp_path_factory.mktemp("state")
    directory.chmod(0o700)
    return SpillFile.open(directory, block_size=SMALL)


def _readings(s: StepSeries, bounds: list[int]) -> tuple:
    pairs = list(zip(bounds, bounds[1:]))
    return (
        s.integrals(bounds),
        [s.integral_to(t) for t in bounds],
        s.values_at(bounds),
        s.current(),
        s.horizon,
        (s.otimes, s.orates, s.ocum),
        [s.times_between(lo, hi) for lo, hi in pairs],
        [s.count_between(lo, hi) for lo, hi in pairs],
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, PROBES, SIZES)
def test_a_spilled_series_reads_as_one_kept_whole(spill, ops, probes, size) -> None:
    spilled, whole = StepSeries(BUCKET, spill), StepSeries(BUCKET)
    for op in ops:
        if isinstance(op, int):
            with sealing(2, 3):
                spilled.compact(op)
            with sealing(10**9, 1):
                whole.compact(op)
        else:
            t, g, m = op
            delta = (g, 10 * g, m * size)
            with sealing(2, 3):
                spilled.add_delta(t, delta)
            with sealing(10**9, 1):
                whole.add_delta(t, delta)
    series_module._opened.clear()  # every chunk read back from the file
    bounds = sorted(probes)
    assert _readings(spilled, bounds) == _readings(whole, bounds)


def _ledgers(blocks: SpillFile, jobs: int) -> tuple[Ledger, Ledger]:
    """A ledger on ``blocks`` and one in memory, fed the same history and compacted as it goes
    (a window of 20 s, 1 s buckets: chunks sealed early are dropped before the end)."""
    on_file, in_memory = Ledger(1, 20, 400, blocks), Ledger(1, 20, 400)
    for k, fact in enumerate(_history(jobs, users=3)):
        for ledger in (on_file, in_memory):
            ledger.apply(fact)
            if k % 500 == 0:
                ledger.compact(fact.at)
    return on_file, in_memory


class Counted(SpillFile):
    """A spill file that counts the bytes put into it."""

    written = 0

    def put(self, data: bytes) -> Placed:
        self.written += len(data)
        return super().put(data)


def test_a_spilled_ledger_reads_the_same_and_writes_over_freed_blocks(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    spill = Counted.open(tmp_path, block_size=4096)
    with sealing(8, 16):
        on_file, in_memory = _ledgers(spill, 20_000)  # 40 s of history, 60,000 facts
    series_module._opened.clear()  # every chunk read back from the file
    chunks = [
        c for node in on_file.nodes.values() for s in (node.requested, node.used) for c in s.sealed
    ]
    assert chunks and all(isinstance(c.block, blocks_module._FileBlock) for c in chunks)
    bounds = list(range(1_800_000_000_000 - 1000, 1_800_000_041_000, 97))
    for path in in_memory.nodes:
        for kind in ("requested", "used"):
            assert on_file.integrals(path, kind, bounds) == in_memory.integrals(path, kind, bounds)
    # half the history was compacted away: its blocks were written over, the file did not grow
    live = sum(c.size for c in chunks)
    assert spill.size < 0.7 * spill.written and spill.size < 1.2 * live + 8 * 4096


def test_the_spill_file_has_no_name(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    spill = SpillFile.open(tmp_path)
    spill.put(b"x" * 100)
    assert list(tmp_path.iterdir()) == []
    assert os.readlink(f"/proc/self/fd/{spill.fd}").endswith("(deleted)")
    assert not os.get_inheritable(spill.fd)  # the jobs the service starts never get it
    assert os.stat(spill.fd).st_mode & 0o777 == 0o600


def test_the_spill_file_is_made_only_in_a_private_directory(tmp_path: Path) -> None:
    for mode in (0o777, 0o770, 0o1777):
        tmp_path.chmod(mode)
        with pytest.raises(PermissionError):
            SpillFile.open(tmp_path)
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "private").mkdir(mode=0o700)
    (tmp_path / "to-open").symlink_to(tmp_path / "open")
    (tmp_path / "to-private").symlink_to(tmp_path / "private")
    with pytest.raises(PermissionError):
        SpillFile.open(tmp_path / "to-open")  # the directory a link leads to is the one checked
    assert SpillFile.open(tmp_path / "to-private").size == BLOCK
    assert list((tmp_path / "private").iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory of another account needs root")
def test_a_state_dir_swapped_for_a_users_folder_gets_no_spill_file(tmp_path: Path) -> None:
    """The attack on a service run as root: a hub user who could rename a folder above the
    state directory puts a link there to a folder of their own (private, 0700, so the mode
    alone would pass). The folder opened is checked for its owner before anything is made in
    it, so nothing of the service's lands where the user can read, link or fill it."""
    tmp_path.chmod(0o700)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)  # nobody: a hub user's account
    (tmp_path / "state").symlink_to(theirs)
    for directory in (theirs, tmp_path / "state"):
        with pytest.raises(PermissionError, match="not private to this service's user"):
            SpillFile.open(directory)
    assert list(theirs.iterdir()) == []
    assert not [fd for fd in os.listdir("/proc/self/fd") if _leads_to(fd, theirs)]


def _leads_to(fd: str, folder: Path) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder))
    except OSError:
        return False


def test_a_chunk_that_cannot_be_written_stays_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path.chmod(0o700)
    spill = SpillFile.open(tmp_path)

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(blocks_module.os, "pwrite", full)
    placed = spill.put(b"abc")
    assert isinstance(placed.block, blocks_module._MemoryBlock)
    assert bytes(placed.block.read(placed.at, 3)) == b"abc"
    assert spill.failed is not None and spill.failed.errno == errno.ENOSPC


def test_the_service_meters_into_its_state_directory(tmp_path: Path) -> None:
    class Service(Configurable):  # what Metering reads of its parent, the service
        state_dir = Unicode(str(tmp_path))

    class NoTransitions:
        def preemption_details(self) -> list:
            return []

        def transition_facts(self, after: int) -> list:
            return []

    tmp_path.chmod(0o700)
    meter = Metering(store=NoTransitions(), parent=Service(), sample_interval=0)
    assert isinstance(meter.ledger.blocks, SpillFile)
    tmp_path.chmod(0o777)  # not the service's own any more: memory, and a warning
    assert (
        Metering(store=NoTransitions(), parent=Service(), sample_interval=0).ledger.blocks is MEMORY
    )
    assert Metering(store=NoTransitions(), sample_interval=0).ledger.blocks is MEMORY


def _grown_per_job(ledger: Ledger) -> float:
    """Bytes of Python memory a job of bench_service's history costs past the first 3,000."""
    facts = _history(15_000, users=2)
    for fact in facts[:9_000]:
        ledger.apply(fact)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for fact in facts[9_000:]:
            ledger.apply(fact)
        return (tracemalloc.get_traced_memory()[0] - before) / 12_000
    finally:
        tracemalloc.stop()


def test_a_spilled_ledger_keeps_the_chunks_bytes_out_of_memory(tmp_path: Path) -> None:
    """What is left per job is each chunk's few small objects (the bytes' place, its first
    time), a byte or two a change, and the newest points: about a quarter of what the same
    ledger keeps with its chunks' bytes in memory."""
    tmp_path.chmod(0o700)
    spilled = _grown_per_job(Ledger(blocks=SpillFile.open(tmp_path)))
    in_memory = _grown_per_job(Ledger())
    assert spilled < 0.4 * in_memory, (spilled, in_memory)
