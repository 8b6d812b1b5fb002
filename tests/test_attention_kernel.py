"""The attention kernel (`spec_zoo.runtime.attention_kernel`): rows bit-identical for any row count, a tree
node equal to its chain path, the same attention as the formula it replaces, the custom op's fake
implementation, threads, and its error. Small shapes, no compiling (the compiled runtime's own
invariance tests in tests/test_runtime.py run on it, as it is the default). float32 and bfloat16 (the
cache read as stored, every sum in float32)."""

from __future__ import annotations

import pytest
import torch

from spec_zoo.errors import ConfigError
from spec_zoo.runtime import attention_kernel
from spec_zoo.runtime.compiled import rowwise_attention
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)

MASKED = torch.finfo(torch.float32).min
# (query heads, KV heads, head dim, committed slots): grouped queries, head dims with and without a
# tail past the SIMD width, spans that are and are not a multiple of it
SHAPES = [(4, 2, 16, 37), (9, 3, 64, 130), (2, 1, 12, 64), (6, 6, 72, 5)]
ROWS = list(range(1, 17)) + [23]
DTYPES = [torch.float32, torch.bfloat16]


def chain_inputs(heads, kv_heads, dim, past, rows, seed=0, dtype=torch.float32):
    """A chain of ``rows`` - 1 draft tokens after ``past`` committed slots (row 0: the last committed
    token), laid out as the compiled runtime lays it out: query [1, H, M, D], the cache [1, Hkv, T, D],
    a prefix mask over ``past`` + 1 slots rounded up to 8, each row's path slots root first; in ``dtype``
    (the draft mask is float32, as the runtime makes it)."""
    g = torch.Generator().manual_seed(seed)
    slots_total = past + 1 + rows + 16
    query = torch.randn(1, heads, rows, dim, generator=g)
    key, value = torch.randn(2, 1, kv_heads, slots_total, dim, generator=g)
    span = -(-(past + 1) // 8) * 8
    mask = torch.zeros(1, 1, 1, span)
    mask[..., past + 1:] = MASKED
    width = -(-rows // 16) * 16  # paths padded to a multiple of 16 slots, as the runtime pads them
    slots = torch.zeros(rows, width, dtype=torch.long)
    draft_mask = torch.full((rows, width), MASKED)
    for r in range(1, rows):
        slots[r, :r] = past + 1 + torch.arange(r)
        draft_mask[r, :r] = 0.0
    return query.to(dtype), key.to(dtype), value.to(dtype), mask.clamp(min=torch.finfo(dtype).min).to(dtype), slots, \
        draft_mask


def kernel(query, key, value, mask, slots, draft_mask, softcap=None):
    return attention_kernel.attend(query, key, value, mask, 0.3, slots, draft_mask, softcap)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,dim,past", SHAPES)
def test_rows_are_bit_identical_for_any_row_count(heads, kv_heads, dim, past, dtype):
    attention_kernel.load()
    q, k, v, mask, slots, draft_mask = chain_inputs(heads, kv_heads, dim, past, max(ROWS), dtype=dtype)
    alone = [kernel(q[:, :, i:i + 1], k, v, mask, slots[i:i + 1], draft_mask[i:i + 1]) for i in range(max(ROWS))]
    differ = [m for m in ROWS if not torch.equal(kernel(q[:, :, :m], k, v, mask, slots[:m], draft_mask[:m]),
                                                 torch.cat(alone[:m], dim=2))]
    assert differ == []


@pytest.mark.parametrize("softcap", [None, 2.5])
def test_it_is_the_attention_of_the_formula_it_replaces(softcap):
    attention_kernel.load()
    q, k, v, mask, slots, draft_mask = chain_inputs(9, 3, 64, 130, 6)
    formula = rowwise_attention(None, q, k, v, mask, 0.3, draft_slots=slots, draft_mask=draft_mask, softcap=softcap)[0]
    ours = rowwise_attention(None, q, k, v, mask, 0.3, draft_slots=slots, draft_mask=draft_mask, softcap=softcap,
                             kernel=True)[0]
    torch.testing.assert_close(ours, formula)
    # and the formula is attention: row 2 (two draft tokens deep) against a plain softmax over what it sees
    seen = torch.cat([torch.arange(131), torch.tensor([131, 132])])
    keys, values = k[0].repeat_interleave(3, 0)[:, seen], v[0].repeat_interleave(3, 0)[:, seen]
    scores = q[0, :, 2:3] @ keys.transpose(-1, -2) * 0.3
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    torch.testing.assert_close(ours[0, 2], (scores.softmax(-1) @ values)[:, 0])


def test_in_bfloat16_it_is_the_float32_attention_of_the_stored_values_rounded_once():
    """bf16 in, bf16 out, float32 sums: the float32 kernel on the same (exactly widened) values,
    rounded to bf16 once, bit for bit."""
    attention_kernel.load()
    q, k, v, mask, slots, draft_mask = chain_inputs(9, 3, 64, 130, 6, dtype=torch.bfloat16)
    ours = kernel(q, k, v, mask, slots, draft_mask)
    assert ours.dtype == torch.bfloat16
    wide = kernel(q.float(), k.float(), v.float(), mask.float(), slots, draft_mask)
    assert torch.equal(ours, wide.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_tree_node_equals_its_path_scored_as_a_chain(dtype):
    """Node 3 of a tree (path 0 -> 2 -> 3, its slots far apart, siblings between) gets the bits the
    same path gets as a chain in consecutive slots: only its path's keys, root first, are read."""
    attention_kernel.load()
    past, dim = 40, 16
    q, k, v, mask, _, _ = chain_inputs(4, 2, dim, past, 5, dtype=dtype)
    chain_slots = torch.zeros(1, 16, dtype=torch.long)
    chain_slots[0, :3] = torch.tensor([past + 1, past + 2, past + 3])
    path_mask = torch.full((1, 16), MASKED)
    path_mask[0, :3] = 0.0
    tree_k, tree_v = k.clone(), v.clone()
    for chain_slot, tree_slot in zip([past + 1, past + 2, past + 3], [past + 1, past + 3, past + 4]):
        tree_k[:, :, tree_slot], tree_v[:, :, tree_slot] = k[:, :, chain_slot], v[:, :, chain_slot]
    tree_k[:, :, past + 2] = torch.randn(2, dim).to(dtype)  # a sibling's key, not on the path
    tree_slots = chain_slots.clone()
    tree_slots[0, :3] = torch.tensor([past + 1, past + 3, past + 4])
    row = q[:, :, 3:4]
    assert torch.equal(kernel(row, tree_k, tree_v, mask, tree_slots, path_mask),
                       kernel(row, k, v, mask, chain_slots, path_mask))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("past", [37, 130, 143])
def test_a_draft_row_equals_the_row_plain_decoding_scores_once_its_path_is_committed(past, dtype):
    """Row i of a chain (i draft tokens deep) gets the bits that one row gets after ``past`` + i
    committed slots: plain decoding's step there. Its path's keys are summed in the lanes they take
    as prefix slots, so speculative decoding reproduces plain decoding, not just itself."""
    attention_kernel.load()
    rows = 20
    q, k, v, mask, slots, draft_mask = chain_inputs(9, 3, 64, past, rows, dtype=dtype)
    chain = kernel(q, k, v, mask, slots, draft_mask)
    differ = []
    for i in range(rows):
        span = -(-(past + 1 + i) // 8) * 8
        committed = torch.zeros(1, 1, 1, span)
        committed[..., past + 1 + i:] = MASKED
        committed = committed.clamp(min=torch.finfo(dtype).min).to(dtype)
        nothing = torch.full((1, 16), MASKED)
        plain = kernel(q[:, :, i:i + 1], k, v, committed, torch.zeros(1, 16, dtype=torch.long), nothing)
        if not torch.equal(plain[:, :, 0], chain[:, :, i]):
            differ.append(i)
    assert differ == []


def test_the_invariance_check_catches_an_order_changing_variant():
    """An attention that switches to another summation order once more than 4 rows come (the
    formula's, as a kernel blocked per row count would) is caught by the same comparison."""
    attention_kernel.load()
    q, k, v, mask, slots, draft_mask = chain_inputs(9, 3, 64, 130, 8)

    def switch_past_four(q, slots, draft_mask):
        return rowwise_attention(None, q, k, v, mask, 0.3, draft_slots=slots, draft_mask=draft_mask,
                                 kernel=q.shape[2] <= 4)[0].transpose(1, 2)

    alone = torch.cat([switch_past_four(q[:, :, i:i + 1], slots[i:i + 1], draft_mask[i:i + 1]) for i in range(8)], 2)
    differ = [m for m in range(1, 9) if not torch.equal(switch_past_four(q[:, :, :m], slots[:m], draft_mask[:m]),
                                                        alone[:, :, :m])]
    assert differ == [5, 6, 7, 8]


def test_threads_split_heads_not_sums():
    attention_kernel.load()
    q, k, v, mask, slots, draft_mask = chain_inputs(9, 3, 64, 130, 7)
    one = kernel(q, k, v, mask, slots, draft_mask)
    torch.set_num_threads(2)
    try:
        assert torch.equal(kernel(q, k, v, mask, slots, draft_mask), one)
    finally:
        torch.set_num_threads(1)


def test_the_op_has_a_fake_implementation():
    attention_kernel.load()
    q, k, v, mask, slots, draft_mask = chain_inputs(4, 2, 16, 37, 3)
    torch.library.opcheck(torch.ops.spec_zoo.rowwise_attention.default, (q, k, v, mask, slots, draft_mask, 0.3, 0.0))


def test_bad_inputs_are_refused_by_the_op():
    attention_kernel.load()
    q, k, v, mask, slots, draft_mask = chain_inputs(4, 2, 16, 37, 3)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernel(q.double(), k.double(), v.double(), mask, slots, draft_mask)
    with pytest.raises(RuntimeError, match="alike"):
        kernel(q, k.to(torch.bfloat16), v, mask, slots, draft_mask)
    with pytest.raises(RuntimeError, match="past the cache"):
        kernel(q, k, v, mask, slots + 10_000, draft_mask)


def test_no_compiler_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(ConfigError, match="model.attention=inductor"):
        attention_kernel.load.__wrapped__()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_kernel", [True, False])
def test_a_packed_batch_row_equals_the_row_scored_alone(dtype, use_kernel):
    """Three sequences with their own caches and lengths, their rows packed into one query (each
    row naming its cache entry and carrying its own mask row): every row is bit-identical to its
    sequence scored alone, on the kernel and on the formula inductor compiles."""
    if use_kernel:
        attention_kernel.load()
    pieces = [chain_inputs(6, 2, 64, past, rows, seed=past, dtype=dtype) for past, rows in ((37, 3), (130, 1), (5, 4))]
    slots_total = max(k.shape[2] for _, k, _, _, _, _ in pieces)
    span = max(mask.shape[-1] for _, _, _, mask, _, _ in pieces)
    width = max(slots.shape[1] for *_, slots, _ in pieces)

    def padded(x, size, dim, fill):
        return torch.cat([x, x.new_full((*x.shape[:dim], size - x.shape[dim], *x.shape[dim + 1:]), fill)], dim)

    low = torch.finfo(dtype).min
    key = torch.cat([padded(k, slots_total, 2, 0) for _, k, _, _, _, _ in pieces])
    value = torch.cat([padded(v, slots_total, 2, 0) for _, _, v, _, _, _ in pieces])
    query = torch.cat([q for q, *_ in pieces], dim=2)
    mask = torch.cat([padded(mask, span, 3, low).expand(1, 1, q.shape[2], span) for q, _, _, mask, _, _ in pieces], 2)
    slots = torch.cat([padded(s, width, 1, 0) for *_, s, _ in pieces])
    draft_mask = torch.cat([padded(dm, width, 1, MASKED) for *_, dm in pieces])
    row_cache = torch.cat([torch.full((q.shape[2],), i) for i, (q, *_) in enumerate(pieces)])
    packed = rowwise_attention(None, query, key, value, mask, 0.3, draft_slots=slots, draft_mask=draft_mask,
                               row_cache=row_cache, kernel=use_kernel)[0]
    alone = torch.cat([rowwise_attention(None, q, k, v, m, 0.3, draft_slots=s, draft_mask=dm, kernel=use_kernel)[0]
                       for q, k, v, m, s, dm in pieces], dim=1)
    assert torch.equal(packed, alone)
    # and a row whose cache entry is its neighbour's reads other keys: the test can tell
    wrong = rowwise_attention(None, query, key, value, mask, 0.3, draft_slots=slots, draft_mask=draft_mask,
                              row_cache=row_cache.roll(1), kernel=use_kernel)[0]
    assert not torch.equal(wrong, alone)
