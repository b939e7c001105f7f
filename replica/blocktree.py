"""The tree of uncommitted blocks above the last committed one, and the commit rule.

The root is the last committed block. Everything below it is pruned when it commits, and
so are forks that do not descend from it, so memory is bounded by the uncommitted suffix
(itself bounded by `Limits.pending_blocks_max`) however long the cluster runs.

Commit rule (the 2-chain of Jolteon, FC'22, §3, and DiemBFT v4 §4, with the voting rules
of replica/safety.py): when a QC certifies block B1 whose parent B0 is of the view just
before (B1.view = B0.view + 1), B0 and all its uncommitted ancestors commit. It needs one
round fewer than HotStuff's 3-chain (PODC'19, §5), which also needed B1's child certified.
"""

from __future__ import annotations

from quorumgate.replica.types import Block, CommitProof, QuorumCert


class BlockTree:
    __slots__ = ("_blocks", "_children", "_pending_max", "root")

    def __init__(self, root: Block, pending_max: int) -> None:
        self.root = root
        self._blocks: dict[bytes, Block] = {root.hash: root}
        self._children: dict[bytes, list[bytes]] = {root.hash: []}
        self._pending_max = pending_max

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._blocks

    def get(self, block_hash: bytes) -> Block | None:
        return self._blocks.get(block_hash)

    @property
    def committed_height(self) -> int:
        return self.root.height

    @property
    def full(self) -> bool:
        return len(self._blocks) > self._pending_max

    def insert(self, block: Block) -> bool:
        """Add a block whose parent is in the tree. False if it was already there."""
        if block.hash in self._blocks:
            return False
        assert block.parent_hash in self._blocks, "insert needs the parent"
        assert block.height > self.root.height, "insert below the committed root"
        self._blocks[block.hash] = block
        self._children[block.hash] = []
        self._children[block.parent_hash].append(block.hash)
        return True

    def blocks(self) -> list[Block]:
        """Every block above the root (uncommitted), in no particular order."""
        return [b for h, b in self._blocks.items() if h != self.root.hash]

    def retain(self, tips: list[bytes]) -> int:
        """Keep the root, `tips` that are in the tree and all their ancestors; drop every
        other block. The kept set is closed under parents, so nothing is orphaned.
        Returns how many blocks were dropped."""
        keep: set[bytes] = {self.root.hash}
        for tip in tips:
            cur = self._blocks.get(tip)
            while cur is not None and cur.hash not in keep:
                keep.add(cur.hash)
                cur = self._blocks.get(cur.parent_hash)
        dropped = len(self._blocks) - len(keep)
        if dropped:
            self._blocks = {h: b for h, b in self._blocks.items() if h in keep}
            self._children = {h: [c for c in self._children[h] if c in keep] for h in keep}
        return dropped

    def extends(self, block_hash: bytes, ancestor_hash: bytes) -> bool:
        """True if `block_hash` is `ancestor_hash` or descends from it within the tree."""
        cur = self._blocks.get(block_hash)
        while cur is not None:
            if cur.hash == ancestor_hash:
                return True
            if cur.hash == self.root.hash:
                return False
            cur = self._blocks.get(cur.parent_hash)
        return False

    def uncommitted_chain(self, tip_hash: bytes) -> list[Block]:
        """Blocks from just above the root up to `tip_hash`, oldest first."""
        chain: list[Block] = []
        cur = self._blocks.get(tip_hash)
        while cur is not None and cur.hash != self.root.hash:
            chain.append(cur)
            cur = self._blocks.get(cur.parent_hash)
        chain.reverse()
        return chain

    def two_chain(self, qc: QuorumCert) -> tuple[list[Block], CommitProof] | None:
        """Apply the commit rule to a new QC: the blocks it commits, oldest first, and why."""
        b1 = self._blocks.get(qc.block_hash)
        if b1 is None or b1.hash == self.root.hash:
            return None
        b0 = self._blocks.get(b1.parent_hash)
        if b0 is None or b0.height <= self.root.height:
            return None
        if b1.view != b0.view + 1:
            return None
        chain = self.uncommitted_chain(b0.hash)
        assert chain and chain[0].parent_hash == self.root.hash, "commit must extend the root"
        return chain, CommitProof.two_chain(b1, qc)

    def commit(self, block: Block) -> None:
        """Make `block` the new root and drop everything that does not descend from it."""
        assert self.extends(block.hash, self.root.hash), "committing a fork of the root"
        keep: dict[bytes, Block] = {}
        stack = [block.hash]
        while stack:
            h = stack.pop()
            keep[h] = self._blocks[h]
            stack.extend(self._children[h])
        self._children = {h: [c for c in self._children[h] if c in keep] for h in keep}
        self._blocks = keep
        self.root = block
