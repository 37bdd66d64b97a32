"""The server's random ids: bytes from the OS's CSPRNG handed out once, in the parent and in a forked child."""

from __future__ import annotations

import os
import re
import time
import uuid

from server import ids
from server.tasks import new_id

UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def test_ids_are_version_7_uuids_never_repeated_across_blocks() -> None:
    minted = [new_id() for _ in range(3 * ids.BLOCK // 10 + 7)]  # past three refills (10 random bytes an id)
    assert len(set(minted)) == len(minted)
    assert all(UUID7.match(i) for i in minted)


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


def test_task_ids_are_time_ordered_version_7_uuids_in_canonical_text() -> None:
    """Unique, canonical RFC 9562 version 7 text, and ordered by the millisecond they were made
    in (the tasks table's key grows at its end); within one millisecond the order is random."""
    before = time.time_ns() // 1_000_000
    minted = [new_id() for _ in range(1000)]  # not `ids`: that is the module under test
    after = time.time_ns() // 1_000_000
    assert len(set(minted)) == 1000
    stamps = []
    for text in minted:
        parsed = uuid.UUID(text)
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122 and str(parsed) == text
        stamps.append(int.from_bytes(parsed.bytes[:6], "big"))
    assert stamps == sorted(stamps) and before <= stamps[0] and stamps[-1] <= after
    assert len({text[14:] for text in minted}) == 1000  # the random part alone tells them apart
