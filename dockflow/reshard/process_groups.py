"""The torch.distributed subgroups resharding gathers in, created once per update layout and reused."""

from __future__ import annotations

import torch.distributed as dist

from dockflow.reshard.layout import ParallelLayout
from dockflow.reshard.routes import KIND_ORDER


class ReshardGroups:
    """Subgroups of ``group`` (default: the world) for every gather group of ``layout``.

    ``dist.new_group`` is collective over the default group: construct this on every rank of the default
    group, in the same order relative to other group creations, and keep it for the life of the job.
    Layout ranks are ranks inside ``group``; a group spanning all of ``group`` reuses ``group`` itself.
    """

    def __init__(self, layout: ParallelLayout, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ReshardGroups needs torch.distributed initialised (init_process_group) first")
        self.layout = layout
        self.group = group if group is not None else dist.group.WORLD
        size = dist.get_world_size(self.group)
        if size != layout.size:
            raise ValueError(f"layout {layout} spans {layout.size} ranks but the process group has {size}")
        self.rank = dist.get_rank(self.group)
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for kind in KIND_ORDER:
            for ranks in layout.groups(kind):
                key = tuple(ranks)
                if len(key) < 2 or key in self._groups:
                    continue
                if len(key) == size:
                    self._groups[key] = self.group
                else:
                    self._groups[key] = dist.new_group([dist.get_global_rank(self.group, r) for r in key])

    def get(self, members: tuple[int, ...]) -> dist.ProcessGroup:
        """The process group of layout ranks ``members``."""
        try:
            return self._groups[tuple(members)]
        except KeyError:
            raise KeyError(f"no process group for ranks {members} in layout {self.layout}; "
                           f"known: {sorted(self._groups)}") from None
