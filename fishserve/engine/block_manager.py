"""KV block allocation: the free list and each sequence's block table.

Blocks are handed out as a sequence grows and returned the moment it finishes, fails, is
cancelled or preempted. No sequence ever holds blocks for positions it has not reached.
"""

from __future__ import annotations

from collections import deque


class NoFreeBlocksError(RuntimeError):
    """Raised by `allocate` when the pool cannot cover the request (callers check first)."""


class BlockManager:
    """Free list over `num_blocks` blocks of `block_size` positions.

    Block tables are plain lists of block ids owned by the sequences; this class only hands
    ids out and takes them back, and checks that nothing is freed twice.
    """

    def __init__(self, num_blocks: int, block_size: int, reserved: int = 0) -> None:
        """`reserved` leading block ids (e.g. the null block of CUDA graphs) are never handed
        out; `num_blocks` counts the others."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need at least one block of one position, got {num_blocks}x{block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(reserved, reserved + num_blocks))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        """Blocks not owned by any sequence."""
        return len(self._free)

    def blocks_for(self, num_positions: int) -> int:
        """Blocks needed to hold `num_positions` positions."""
        return -(-num_positions // self.block_size)

    def missing(self, table: list[int], num_positions: int) -> int:
        """How many more blocks `table` needs to hold `num_positions` positions."""
        return max(self.blocks_for(num_positions) - len(table), 0)

    def can_grow(self, table: list[int], num_positions: int) -> bool:
        """Whether `table` can be extended to `num_positions` positions now."""
        return self.missing(table, num_positions) <= self.num_free

    def grow(self, table: list[int], num_positions: int) -> None:
        """Append blocks to `table` (in place) until it holds `num_positions` positions.

        Raises:
            NoFreeBlocksError: not enough free blocks (the table is left unchanged).
        """
        need = self.missing(table, num_positions)
        if need > self.num_free:
            raise NoFreeBlocksError(f"need {need} blocks, {self.num_free} free")
        for _ in range(need):
            block = self._free.popleft()
            self._used.add(block)
            table.append(block)

    def release(self, table: list[int]) -> None:
        """Return every block of `table` to the free list and empty it (in place)."""
        for block in table:
            if block not in self._used:
                raise RuntimeError(f"block {block} freed twice")
            self._used.remove(block)
            self._free.append(block)
        table.clear()
