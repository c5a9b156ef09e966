"""Lineage: the parent -> child graph of an archive (networkx, imported lazily)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from archive._errors import ArchiveError

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Lineage"]


class Lineage:
    """The lineage graph of an archive, built from its ``lineage`` sub-database.

    Attributes:
        graph: A :class:`networkx.DiGraph` with an edge ``parent -> child`` for every parent
            a record names; edge attribute ``operator`` is the child's operator. Records
            with neither parents nor children are not nodes.
    """

    def __init__(self, edges: Iterable[tuple[str, str, str]], known: Callable[[str], bool]) -> None:
        import networkx as nx

        g: nx.DiGraph = nx.DiGraph()
        for parent, child, operator in edges:
            g.add_edge(parent, child, operator=operator)
        self.graph = g
        self._known = known

    def _check(self, genome_id: str) -> None:
        if genome_id not in self.graph and not self._known(genome_id):
            raise ArchiveError(f"no record with id {genome_id!r} in the archive")

    def parents(self, genome_id: str) -> list[str]:
        """Direct parents of a record (sorted)."""
        self._check(genome_id)
        return sorted(self.graph.predecessors(genome_id)) if genome_id in self.graph else []

    def children(self, genome_id: str) -> list[str]:
        """Direct children of a record (sorted)."""
        self._check(genome_id)
        return sorted(self.graph.successors(genome_id)) if genome_id in self.graph else []

    def ancestors(self, genome_id: str) -> set[str]:
        """Every record ``genome_id`` descends from (not including itself)."""
        import networkx as nx

        self._check(genome_id)
        return set(nx.ancestors(self.graph, genome_id)) if genome_id in self.graph else set()

    def descendants(self, genome_id: str) -> set[str]:
        """Every record descending from ``genome_id`` (not including itself)."""
        import networkx as nx

        self._check(genome_id)
        return set(nx.descendants(self.graph, genome_id)) if genome_id in self.graph else set()

    def path_to(self, genome_id: str) -> list[str]:
        """Ids from a seed (a record without parents) to ``genome_id``, both included.

        Of several seeds the nearest is taken (ties: the smallest id), so the path is one
        shortest chain of parent -> child steps.
        """
        import networkx as nx

        self._check(genome_id)
        g = self.graph
        if genome_id not in g or g.in_degree(genome_id) == 0:
            return [genome_id]
        rev = g.reverse(copy=False)
        dist: dict[str, int] = nx.single_source_shortest_path_length(rev, genome_id)
        roots = [n for n in dist if g.in_degree(n) == 0]
        if not roots:  # a cycle cannot happen with content ids, but never loop forever
            raise ArchiveError(f"record {genome_id[:12]} has no seed ancestor")
        root = min(roots, key=lambda n: (dist[n], n))
        path: list[str] = nx.shortest_path(g, root, genome_id)
        return path

    def operators(self, path: list[str]) -> list[str | None]:
        """The operator of each step of a path (None for its first element)."""
        out: list[str | None] = [None]
        for a, b in zip(path, path[1:], strict=False):
            out.append(self.graph.edges[a, b].get("operator"))
        return out

    def __len__(self) -> int:
        return int(self.graph.number_of_nodes())

    def __repr__(self) -> str:
        return f"Lineage({self.graph.number_of_nodes()} nodes, {self.graph.number_of_edges()} edges)"

    def _networkx(self) -> Any:  # pragma: no cover - convenience for interactive use
        return self.graph
