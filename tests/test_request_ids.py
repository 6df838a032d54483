"""Generated request ids: unique, and not repeated by a forked child."""

from __future__ import annotations

import os
import re

from trio_sampler.actor._actor import new_request_id


def test_generated_ids_are_64_random_bits_and_unique() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert all(re.fullmatch(r"req_[0-9a-f]{16}", one) for one in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    parents = new_request_id()
    with os.fdopen(read, "rb") as pipe:
        childs = pipe.read().decode()
    os.waitpid(pid, 0)
    assert re.fullmatch(r"req_[0-9a-f]{16}", childs)
    assert childs != parents
