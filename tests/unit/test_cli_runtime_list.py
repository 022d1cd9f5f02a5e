"""`flexai runtime list`'s table: each runtime's image, the digest its nodes hold, and which."""

from __future__ import annotations

from cli.output.tables import render_runtimes_table

IMAGE = "docker://registry.example.com/team/train:1"
DIGEST = "sha256:" + "ab" * 32


def test_the_list_shows_the_digest_and_the_nodes_holding_each_image_and_dashes_for_none() -> None:
    table = render_runtimes_table([
        {"name": "trainer", "image": IMAGE, "digest": DIGEST, "nodes": ["gpu-a", "gpu-b"]},
        {"name": "unpulled", "image": IMAGE, "digest": None, "nodes": []},
    ])  # fmt: skip
    header, held, unpulled = table.splitlines()
    assert header.split() == ["NAME", "IMAGE", "DIGEST", "NODES"]
    assert held.split() == ["trainer", IMAGE, DIGEST, "gpu-a,gpu-b"]
    assert unpulled.split() == ["unpulled", IMAGE, "-", "-"]
