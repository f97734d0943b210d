"""The chaos example's local "providers" (receipts, confirmations): a key is found once
any process filed it, whatever this process read of the file before."""

from __future__ import annotations

from pathlib import Path

from agentledger_examples.chaos_demo.app import _append_once, _filed


def test_a_key_filed_after_a_first_look_is_found(tmp_path: Path) -> None:
    path = tmp_path / "receipts.txt"
    assert not _filed(path, "k1")  # no file yet
    _append_once(path, "k1", "o-1 ch_1", "receipts")
    assert _filed(path, "k1") and not _filed(path, "k2")
    with path.open("a") as other:  # another worker files k2
        other.write("o-2 ch_2 k2\n")
    assert _filed(path, "k2") and _filed(path, "k1")
    _append_once(path, "k2", "o-2 ch_2", "receipts")  # filed already: not again
    assert path.read_text().count(" k2\n") == 1


def test_a_line_being_written_counts_once_complete(tmp_path: Path) -> None:
    path = tmp_path / "receipts.txt"
    path.write_text("o-1 ch_1 k1\no-2 ch_2 k")
    assert _filed(path, "k1") and not _filed(path, "k")
    with path.open("a") as other:
        other.write("2\n")
    assert _filed(path, "k2") and not _filed(path, "k")


def test_a_new_file_under_the_same_name_is_read_anew(tmp_path: Path) -> None:
    path = tmp_path / "receipts.txt"
    path.write_text("o-1 ch_1 k1\no-2 ch_2 k2\n")
    assert _filed(path, "k2")
    path.write_text("o-3 ch_3 k3\n")  # shorter than what was read
    assert _filed(path, "k3") and not _filed(path, "k2")
    path.unlink()
    assert not _filed(path, "k3")
