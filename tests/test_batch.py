"""Unit tests of `baton.batch.Batch`: every operation, padding round trips, transport."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from baton.batch import PAD_KEY, Batch, collate


def _b(n: int = 5) -> Batch:
    return Batch({"x": torch.arange(float(n)).unsqueeze(1).repeat(1, 3),  # [n, 3]
                  "ids": torch.arange(n)},  # [n]
                 {"tag": [f"r{i}" for i in range(n)], "obj": [{"i": i} for i in range(n)]},
                 {"version": 7})


def _rows(b: Batch) -> list[int]:
    return b["ids"].tolist()


# --- construction and access -------------------------------------------------------------
def test_construction_and_access():
    b = _b()
    assert len(b) == 5 and b.keys() == ["x", "ids", "tag", "obj"]
    assert "tag" in b and "nope" not in b
    assert b["obj"][2] == {"i": 2} and b["obj"].dtype == object
    with pytest.raises(KeyError, match="'nope'.*it has"):
        b["nope"]
    assert "len=5" in repr(b) and "x: (5, 3) float32" in repr(b)
    assert len(Batch()) == 0
    assert len(Batch(non_tensors={"t": ["a", "b"]})) == 2


def test_from_dict_and_collate():
    b = Batch.from_dict({"x": torch.zeros(2), "s": ["a", "b"]}, meta={"m": 1})
    assert list(b.tensors) == ["x"] and list(b.non_tensors) == ["s"] and b.meta == {"m": 1}
    c = collate([{"p": "a", "answer": [1, 2]}, {"p": "b", "answer": [3]}])
    assert len(c) == 2 and c["answer"][0] == [1, 2]  # a list stays one object per row


def test_invalid_shapes():
    with pytest.raises(ValueError, match="disagree"):
        Batch({"x": torch.zeros(3), "y": torch.zeros(4)})
    with pytest.raises(ValueError, match="scalar"):
        Batch({"x": torch.tensor(1.0)})


def test_setitem_delitem():
    b = _b(3)
    b["y"] = torch.ones(3)
    b["s"] = ["a", "b", "c"]
    b["x"] = ["now", "non", "tensor"]  # a field may change kind
    assert "x" in b.non_tensors and "x" not in b.tensors
    with pytest.raises(ValueError, match="has 2 rows, the batch has 3"):
        b["y"] = torch.ones(2)
    assert b["y"].shape == (3,)  # a failed assignment leaves the old value
    del b["y"]
    assert "y" not in b
    with pytest.raises(KeyError):
        del b["y"]


# --- selection ------------------------------------------------------------------------
def test_select_shares_tensors():
    b = _b()
    s = b.select("x", "tag")
    assert s.keys() == ["x", "tag"] and s.meta == {"version": 7}
    assert s["x"].data_ptr() == b["x"].data_ptr()
    assert b.select("x", meta=False).meta == {}
    with pytest.raises(KeyError, match="'nope'"):
        b.select("x", "nope")


@pytest.mark.parametrize("index, expect", [
    (slice(1, 3), [1, 2]),
    ([4, 0], [4, 0]),
    (torch.tensor([2, 2]), [2, 2]),
    (torch.tensor([True, False, True, False, False]), [0, 2]),
    (np.array([3]), [3]),
])
def test_rows(index, expect):
    b = _b()
    b.meta[PAD_KEY] = 1
    r = b.rows(index)
    assert _rows(r) == expect and list(r["tag"]) == [f"r{i}" for i in expect]
    assert r.meta == {"version": 7}  # a row subset is no longer padded


# --- split and join --------------------------------------------------------------------
@pytest.mark.parametrize("n, parts", [(5, 2), (5, 4), (1, 3), (6, 3), (7, 1)])
def test_chunk_concat_round_trip(n, parts):
    b = _b(n)
    chunks = b.chunk(parts)
    assert len(chunks) == parts and len({len(c) for c in chunks}) == 1
    assert sum(c.meta[PAD_KEY] for c in chunks) == (-n) % parts
    assert all(c.meta["version"] == 7 for c in chunks)
    back = Batch.concat(chunks)
    assert _rows(back) == list(range(n)) and list(back["tag"]) == list(b["tag"])
    assert PAD_KEY not in back.meta and back.meta == {"version": 7}


def test_chunk_padding_layout():
    chunks = _b(5).chunk(2)
    assert [_rows(c) for c in chunks] == [[0, 1, 2], [3, 4, 0]]  # padding: copies of the first rows
    assert [c.meta[PAD_KEY] for c in chunks] == [0, 1]


def test_rechunking_a_padded_chunk_is_exact():
    chunk = _b(5).chunk(2)[1]  # rows 3, 4 + one padding row
    for n in (1, 2, 3, 4):
        assert _rows(Batch.concat(chunk.chunk(n))) == [3, 4]


def test_pad_to_multiple():
    padded, pad = _b(5).pad_to_multiple(4)
    assert pad == 3 and _rows(padded) == [0, 1, 2, 3, 4, 0, 1, 2]
    same, pad = _b(4).pad_to_multiple(2)
    assert pad == 0 and len(same) == 4
    empty, pad = Batch(non_tensors={"t": []}).pad_to_multiple(2)
    assert pad == 0 and len(empty) == 0 and Batch(non_tensors={"t": []}).chunk(2)[1].meta[PAD_KEY] == 0


def test_concat_errors():
    with pytest.raises(ValueError, match="at least one"):
        Batch.concat([])
    with pytest.raises(ValueError, match="fields differ"):
        Batch.concat([_b(2), _b(2).select("x")])


def test_repeat():
    b = _b(2)
    assert _rows(b.repeat(3)) == [0, 0, 0, 1, 1, 1]
    assert _rows(b.repeat(2, interleave=False)) == [0, 1, 0, 1]
    assert list(b.repeat(2)["tag"]) == ["r0", "r0", "r1", "r1"]


def test_union():
    b = _b(3)
    other = Batch({"x": b["x"].clone(), "z": torch.zeros(3)}, {"tag": list(b["tag"])}, {"version": 7, "m": 1})
    u = b.union(other)
    assert set(u.keys()) == {"x", "ids", "tag", "obj", "z"} and u.meta == {"version": 7, "m": 1}
    assert "z" not in b  # union does not modify its inputs
    with pytest.raises(ValueError, match="key 'x' differs"):
        b.union(Batch({"x": torch.ones(3, 3)}))
    with pytest.raises(ValueError, match="key 'tag' differs"):
        b.union(Batch(non_tensors={"tag": ["a", "b", "c"]}))
    with pytest.raises(ValueError, match="key 'version' differs"):
        b.union(Batch(meta={"version": 8}))
    with pytest.raises(ValueError, match="lengths differ"):
        b.union(_b(2))


def test_to():
    b = _b(2).to("cpu")
    assert b["x"].device.type == "cpu" and b.meta == {"version": 7}


def test_minibatches():
    b = _b(10)
    first = [_rows(m) for m in b.minibatches(4, seed=1)]
    assert first == [_rows(m) for m in b.minibatches(4, seed=1)]  # a seed reproduces the order
    assert [len(m) for m in b.minibatches(4, seed=1)] == [4, 4, 2]
    assert sorted(sum(first, [])) == list(range(10))
    assert [len(m) for m in b.minibatches(4, seed=1, drop_last=True)] == [4, 4]
    assert [_rows(m) for m in b.minibatches(5, shuffle=False)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    with pytest.raises(ValueError, match="positive"):
        next(b.minibatches(0))


def test_minibatches_without_seed_do_not_reseed_the_global_rng():
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    list(_b(4).minibatches(2))  # draws from the global generator ...
    torch.manual_seed(0)  # ... but must not re-seed it
    assert torch.equal(torch.rand(1), expected)
    g = torch.Generator().manual_seed(123)
    state = torch.get_rng_state()
    list(_b(4).minibatches(2, seed=5))
    assert torch.equal(state, torch.get_rng_state()) and g.initial_seed() == 123


# --- transport ---------------------------------------------------------------------------
def _mixed() -> Batch:
    return Batch({"bf": torch.randn(4, 3).to(torch.bfloat16),  # [4, 3] bf16
                  "f": torch.randn(4, 3)[:, :2],  # [4, 2] non-contiguous view
                  "l": torch.arange(4),
                  "m": torch.tensor([True, False, True, True])},
                 {"s": ["a", "b", "c", "d"]}, {"version": 3, PAD_KEY: 1})


def _assert_same(a: Batch, b: Batch) -> None:
    assert a.keys() == b.keys() and a.meta == b.meta
    for k, v in a.tensors.items():
        assert b[k].dtype == v.dtype and torch.equal(b[k], v), k
    assert list(a["s"]) == list(b["s"])


def test_pickle_round_trip_bf16():
    b = _mixed()
    for protocol in (4, 5):
        back = pickle.loads(pickle.dumps(b, protocol=protocol))
        _assert_same(b, back)
    back["bf"] += 1  # usable in place after unpickling


@pytest.mark.ray  # the session's Ray instance (tests/conftest.py)
def test_ray_round_trip_bf16():
    import ray

    @ray.remote
    def echo(x):
        x["bf"] += 0  # in place: Ray's read-only buffers must have been copied
        return x

    b = _mixed()
    back = ray.get(echo.remote(ray.put(b)))  # out to another process and back
    _assert_same(b, back)
    back["l"] += 1
