"""GDN state slots: the conv + recurrent state of every GDN layer, one copy per slot.

A sequence runs in a slot (the `ForwardBatch` names it); other slots hold snapshots of a
sequence's state at a prefix length, restored by copying slot to slot (prefix reuse: attention
rows can be cut anywhere, GDN state cannot). Today slot 0 runs the one sequence and two slots
keep the prefix snapshots; a scheduler will hand a slot to each running request. Copies are
backend copies (device to device on CUDA). Knows nothing about tokens or requests.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..models.state import GDNSlots, SequenceState
from .backends.base import Backend


@dataclass
class StateSlots:
    """The GDN layers of `state` ([slots, ...] buffers) and the backend that copies them."""

    state: SequenceState
    backend: Backend

    @property
    def layers(self) -> list[GDNSlots]:
        return self.state.gdn_layers()

    @property
    def num_slots(self) -> int:
        layers = self.layers
        return layers[0].num_slots if layers else 0

    def copy(self, dst: int, src: int) -> None:
        """Slot `dst` := slot `src`, every GDN layer (snapshot and restore are both this)."""
        if dst == src:
            return
        self._check(dst, src)
        for layer in self.layers:
            a, b = layer.slot(dst), layer.slot(src)
            self.backend.copy_(a.conv, b.conv)
            self.backend.copy_(a.recurrent, b.recurrent)

    def snapshot(self, running: int, into: int) -> None:
        """Keep the running slot's state in slot `into`."""
        self.copy(into, running)

    def restore(self, running: int, source: int) -> None:
        """Bring the running slot back to the state kept in slot `source`."""
        self.copy(running, source)

    def reset(self, slot: int) -> None:
        """Slot `slot` := the state before any token (zeros)."""
        self._check(slot)
        for layer in self.layers:
            s = layer.slot(slot)
            self.backend.zero_(s.conv)
            self.backend.zero_(s.recurrent)

    def _check(self, *slots: int) -> None:
        for s in slots:
            if not 0 <= s < self.num_slots:
                raise IndexError(f"state slot {s} of {self.num_slots}")
