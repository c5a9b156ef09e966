"""The archive: MAP-Elites grid over an LMDB (or in-memory) store, lineage, lessons."""
