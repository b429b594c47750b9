"""The in-process task runner: results in task order, merges folded in task order holding two
results, balanced task groups and atomic task outputs."""

from __future__ import annotations

import pytest

from features.tasks import LocalRunner, atomic_path, balanced_groups, lanes


def test_map_keeps_task_order_and_passes_the_shared_object():
    assert LocalRunner().map(divmod, [7, 9], shared=4) == [(1, 3), (2, 1)]


def test_lanes_cut_the_items_into_contiguous_ranges_of_near_equal_size():
    assert lanes(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert lanes(4, 2) == [(0, 2), (2, 4)]
    assert lanes(2, 5) == [(0, 1), (1, 2)]  # no more lanes than items
    assert lanes(7, 1) == lanes(7, 0) == [(0, 7)]


def test_map_reduce_folds_in_task_order_holding_two_results():
    held, peak = [0], [0]

    def leaf(i: int) -> str:
        held[0] += 1
        peak[0] = max(peak[0], held[0])
        return str(i)

    def merge(a: str, b: str) -> str:
        held[0] -= 1
        return f"({a}{b})"

    assert LocalRunner().map_reduce(leaf, list(range(7)), merge) == "((((((01)2)3)4)5)6)"
    assert peak[0] == 2  # the running result and the task's, however many tasks
    with pytest.raises(ValueError, match="at least one item"):
        LocalRunner().map_reduce(leaf, [], merge)


def test_balanced_groups_cut_contiguous_runs_of_about_equal_weight():
    assert balanced_groups([1] * 10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert balanced_groups([9, 1, 1, 1], 2) == [(0, 1), (1, 4)]
    assert balanced_groups([1, 1], 5) == [(0, 1), (1, 2)]


def test_an_atomic_path_appears_complete_or_not_at_all(tmp_path):
    with atomic_path(tmp_path / "out.bin") as tmp:
        tmp.write_bytes(b"done")
        assert not (tmp_path / "out.bin").exists()
    assert (tmp_path / "out.bin").read_bytes() == b"done"
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "half.bin") as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
