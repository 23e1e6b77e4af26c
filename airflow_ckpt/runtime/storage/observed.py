"""ObservedStorage: a view of a storage that shows every listing it returns to a listener.

The driver's lease lists ``<job>/lease/`` at every heartbeat; handing the lease this
view lets the control channel read the doorbells in that listing without a request of
its own (see :class:`airflow_ckpt.runtime.control.channel.Doorbell`). Everything else passes
straight through, unchanged.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable

from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo
from airflow_ckpt.runtime.storage.delegating import DelegatingStorage

#: (the prefix of a complete listing, the objects under it): called after each listing
ListingListener = Callable[[str, "builtins.list[ObjectInfo]"], None]


class ObservedStorage(DelegatingStorage):
    """``inner``, with ``listener(prefix, objects)`` told of every complete listing.

    A :meth:`list_after` is complete for the prefix ``start_after`` cannot cut into: the
    listener hears ``(prefix, objects)`` only when nothing under the returned range was
    skipped, i.e. it is told about a prefix only what a full listing would say.
    """

    def __init__(self, inner: CheckpointStorage, listener: ListingListener) -> None:
        super().__init__(inner)
        self.listener = listener

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        found = self.inner.list(prefix)
        self.listener(prefix, found)
        return found

    def list_after(self, prefix: str, start_after: str) -> builtins.list[ObjectInfo]:
        found = self.inner.list_after(prefix, start_after)
        if start_after < prefix:  # nothing under the prefix was skipped
            self.listener(prefix, found)
        return found
