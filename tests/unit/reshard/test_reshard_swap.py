"""HostSwap: device storages released and restored bit-identically, tensor identity kept, swap-back in a
background thread, storages that cannot be released refused up front."""

import pytest
import torch

from dockflow.reshard import HostSwap, MemoryLedger, PinnedArena, UpdateState


def _state() -> UpdateState:
    weights = {"a": torch.nn.Parameter(torch.randn(6, 4)), "b": torch.nn.Parameter(torch.randn(5))}
    for w in weights.values():
        w.grad = torch.randn(w.shape)
    optimizer = torch.optim.AdamW(list(weights.values()), lr=0.1)
    optimizer.step()
    return UpdateState(weights, optimizer)


def _raw(tensors):
    return [t.detach().reshape(-1).clone().view(torch.uint8) for t in tensors]


def test_swap_out_frees_and_swap_back_restores_bit_identically():
    state = _state()
    ledger = MemoryLedger("cpu")
    state.track(ledger)
    tensors = state.all_tensors()
    before, ids = _raw(tensors), [id(t) for t in tensors]
    resident = ledger.bytes_by_category()
    assert resident["update_weights"] and resident["grads"] and resident["optimizer_state"]
    swap = HostSwap.swap_out(tensors, "cpu")
    assert swap.host_bytes == sum(resident.values())
    assert all(v == 0 for v in ledger.bytes_by_category().values())
    swap.swap_back(timeout=30)
    assert swap.done and swap.swap_back_s is not None
    after = state.all_tensors()
    assert [id(t) for t in after] == ids
    assert all(torch.equal(x, y) for x, y in zip(before, _raw(after), strict=True))
    state.optimizer.step()  # the restored state works


def test_swap_back_can_start_early_and_views_share_one_storage():
    base = torch.arange(12.0)
    view = base[4:8]
    swap = HostSwap.swap_out([base, view], "cpu")
    assert swap.host_bytes == 48  # one storage
    future = swap.start_swap_back()
    assert swap.start_swap_back() is future  # idempotent
    future.result(timeout=30)
    assert view.tolist() == [4.0, 5.0, 6.0, 7.0]


def test_storages_that_cannot_be_resized_are_refused_before_anything_moves():
    free = torch.randn(3)
    pinned_by_numpy = torch.randn(3)
    pinned_by_numpy.numpy()
    with pytest.raises(ValueError, match="1 of 2 storages to swap cannot be resized"):
        HostSwap.swap_out([free, pinned_by_numpy], "cpu")
    assert free.untyped_storage().nbytes() == 12  # untouched


def test_tensors_on_other_devices_are_left_alone():
    t = torch.randn(3)
    swap = HostSwap.swap_out([t], "meta")
    assert swap.host_bytes == 0 and t.untyped_storage().nbytes() == 12


def test_an_arena_is_reused_swap_after_swap_and_holds_one_swap_at_a_time():
    """The engines' path: one host buffer for every swap-out (pinned on an accelerator), grown only when a swap
    needs more, refused while the last swap is still out."""
    arena = PinnedArena("cpu")
    state = _state()
    before = _raw(state.all_tensors())
    swap = HostSwap.swap_out(state.all_tensors(), "cpu", arena=arena)
    host = arena._host
    assert arena.busy and arena.nbytes >= swap.host_bytes
    with pytest.raises(RuntimeError, match="swap it back first"):
        HostSwap.swap_out(_state().all_tensors(), "cpu", arena=arena)
    swap.swap_back(timeout=30)
    assert not arena.busy
    assert all(torch.equal(x, y) for x, y in zip(before, _raw(state.all_tensors()), strict=True))
    for _ in range(2):  # the same bytes again: the same buffer
        HostSwap.swap_out(state.all_tensors(), "cpu", arena=arena).swap_back(timeout=30)
        assert arena._host is host
    bigger = [torch.randn(4096)]
    HostSwap.swap_out(bigger, "cpu", arena=arena).swap_back(timeout=30)
    assert arena._host is not host and arena.nbytes >= 4096 * 4
