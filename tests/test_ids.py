"""The server's random ids: bytes from the OS's CSPRNG handed out once, in the parent and in a forked child."""

from __future__ import annotations

import os
import re

from server import ids
from server.tasks import new_id

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def test_ids_are_version_4_uuids_never_repeated_across_blocks() -> None:
    minted = [new_id() for _ in range(3 * ids.BLOCK // 16 + 7)]  # past three refills
    assert len(set(minted)) == len(minted)
    assert all(UUID4.match(i) for i in minted)


def test_a_forked_child_never_hands_out_the_parents_bytes() -> None:
    ids.random_bytes(16)  # the parent holds a block with bytes still to hand out
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.write(write, ids.random_bytes(64))
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    from_child = os.read(read, 64)
    os.close(read)
    assert len(from_child) == 64 and from_child != ids.random_bytes(64)
