"""Live allocations by address range: which pointers a backend may touch.

Starts are kept sorted, so a lookup is a bisect; a pointer anywhere inside an
allocation is valid, a range that runs past its allocation's end is not. Each entry
holds its memory's owner (a host buffer, device memory, an imported JAX array), so the
memory lives at least as long as the entry. Thread-safe."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

from oxijax.backend._errors import InvalidArgument


@dataclass
class Allocation:
    start: int
    size: int
    owners: list = field(default_factory=list)  # imports of the same array stack up
    imported: bool = False

    @property
    def end(self) -> int:
        return self.start + self.size


class AllocationTracker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._by_start: dict[int, Allocation] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._starts)

    def _containing(self, ptr: int) -> Allocation | None:
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i < 0:
            return None
        allocation = self._by_start[self._starts[i]]
        return allocation if ptr < allocation.end else None

    def add(self, start: int, size: int, owner: object, imported: bool = False) -> None:
        with self._lock:
            same = self._by_start.get(start)
            if same is not None and imported and same.imported and same.size == size:
                same.owners.append(owner)
                return
            i = bisect.bisect_left(self._starts, start)
            before = self._by_start[self._starts[i - 1]] if i > 0 else None
            after = self._starts[i] if i < len(self._starts) else None
            if (before is not None and before.end > start) or (
                    after is not None and after < start + size):
                raise InvalidArgument(f"memory at {start:#x} ({size} bytes) overlaps memory "
                                      "this backend already tracks")
            self._starts.insert(i, start)
            self._by_start[start] = Allocation(start, size, [owner], imported)

    def remove(self, ptr: int) -> object:
        """Forgets the allocation starting at ptr; returns its owner."""
        with self._lock:
            allocation = self._by_start.get(ptr)
            if allocation is None:
                inside = self._containing(ptr)
                where = (f"points inside the allocation at {inside.start:#x}" if inside else
                         "was never allocated by this backend or was already freed")
                raise InvalidArgument(f"cannot free {ptr:#x}: it {where}")
            owner = allocation.owners.pop()
            if not allocation.owners:
                del self._by_start[ptr]
                self._starts.pop(bisect.bisect_left(self._starts, ptr))
            return owner

    def find(self, ptr: int, nbytes: int, argument: str) -> Allocation:
        """The allocation holding [ptr, ptr + nbytes); InvalidArgument if there is none."""
        with self._lock:
            allocation = self._containing(ptr)
        if allocation is None:
            raise InvalidArgument(f"{argument} ({ptr:#x}) is not inside any live allocation "
                                  "of this backend (never allocated, freed, or foreign)")
        if ptr + nbytes > allocation.end:
            raise InvalidArgument(
                f"{argument}: {nbytes} bytes at {ptr:#x} run {ptr + nbytes - allocation.end} "
                f"bytes past the end of its allocation ({allocation.size} bytes at "
                f"{allocation.start:#x})")
        return allocation

    def clear(self) -> list:
        """Forgets everything; returns the owners (dropping them frees the memory)."""
        with self._lock:
            owners = [o for a in self._by_start.values() for o in a.owners]
            self._starts.clear()
            self._by_start.clear()
            return owners
