"""The store of kiln.graph.memo (compiled entry functions, rewritten guards) in the kernel cache's
directory: `<key>.code` and `<key>.text` entries, sealed, trusted and evicted as `.so` entries are
(kiln.runtime.cache). A refused entry is removed and counted; a failed write costs only the saving."""
from __future__ import annotations

from .. import config
from ..counters import counters
from ..graph import memo
from . import cache

log = config.channel("cache")


class DiskStore:
    def get(self, key: str, suffix: str) -> bytes | None:
        if not config.get("graph_cache"):
            return None
        data = cache.read_entry(key, suffix)
        log.debug("entry cache %s %s%s", "miss" if data is None else "hit", key, suffix)
        return data

    def put(self, key: str, suffix: str, data: bytes) -> None:
        if not config.get("graph_cache"):
            return
        try:
            cache.write_entry(cache.directory(), key, data, suffix)
        except OSError as e:
            counters["cache"]["entries not written"] += 1
            log.info("writing a %s entry failed: %s", suffix, e)
        else:
            log.debug("entry cache wrote %s%s", key, suffix)


memo.install(DiskStore())
