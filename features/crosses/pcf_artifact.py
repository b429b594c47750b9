"""The PCF-GNN serving artifact: cached node vectors, the relation table and the edge head
(in numpy), saved as ``pcf_gnn.json`` plus ``pcf_gnn.npz`` (and the graph under ``graph/``).
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from features.crosses.artifact import CrossArtifactError
from features.crosses.pcf_graph import PairGraph, field_offsets
from features.json_files import read_json_object

ARTIFACT_FILE = "pcf_gnn.json"
ARRAYS_FILE = "pcf_gnn.npz"
_WHAT = "the folder `stitchrec crosses pcf-gnn` writes"
GRAPH_DIR = "graph"
_LOGIT_CLIP = 1e-4


def logit(p: np.ndarray | float) -> np.ndarray:
    p = np.clip(np.asarray(p, np.float64), _LOGIT_CLIP, 1 - _LOGIT_CLIP)
    return np.log(p / (1 - p))


def head_forward(
    hu: np.ndarray, hv: np.ndarray, rel: np.ndarray, head: list[tuple[np.ndarray, np.ndarray]]
) -> np.ndarray:
    """The edge head in numpy: ``sigmoid(MLP([hu; hv; hu*hv; rel]))``, ``[n]`` float64.

    ``head``: ``(kernel, bias)`` per dense layer, ReLU between them, the last one of width 1.
    """
    x = np.concatenate([hu, hv, hu * hv, rel], axis=1).astype(np.float64)
    for i, (w, b) in enumerate(head):
        x = x @ w + b
        if i < len(head) - 1:
            x = np.maximum(x, 0.0)
    return 1.0 / (1.0 + np.exp(-x[:, 0]))


@dataclasses.dataclass
class PCFArtifact:
    """What serving needs: node vocabularies, cached node vectors, relation vectors, the head.

    Attributes:
      fields: node fields; ``offsets[f] + local id`` indexes ``nodes``.
      vocab: ``{field: values}`` (local id ``i + 1``; 0 the OOV node).
      multi: ``{field: separator}`` of multi-valued fields.
      pairs: the relations, in order; ``relations[r]`` is relation ``r``'s vector.
      nodes: cached ``h^K``, float32 ``[num_nodes, dim]``.
      relations: float32 ``[n_pairs, relation_dim]``.
      head: ``(kernel, bias)`` float32 per dense layer.
      prior, alpha: the graph's training click rate and smoothing strength.
      config: the ``PCFGNNConfig`` as a dict; ``history``: training progress.
    """

    fields: list[str]
    vocab: dict[str, list[str]]
    multi: dict[str, str]
    pairs: list[tuple[str, str]]
    nodes: np.ndarray
    relations: np.ndarray
    head: list[tuple[np.ndarray, np.ndarray]]
    prior: float
    alpha: float
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def offsets(self) -> dict[str, int]:
        return field_offsets(self.fields, self.vocab)

    def predict(self, r: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Predicted statistic of relation ``r`` for local ids ``u`` (field a), ``v`` (field b)."""
        a, b = self.pairs[r]
        off = self.offsets
        hu = self.nodes[off[a] + np.asarray(u)]
        hv = self.nodes[off[b] + np.asarray(v)]
        rel = np.repeat(self.relations[r : r + 1], len(hu), axis=0)
        return head_forward(hu, hv, rel, self.head)

    def serving_bytes(self) -> dict[str, int]:
        """Bytes serving holds: node table + relation table + head, and the node vocabularies
        (UTF-8 bytes plus an 8-byte offset per value, as an Arrow string array holds them)."""
        params = self.nodes.nbytes + self.relations.nbytes
        params += sum(w.nbytes + b.nbytes for w, b in self.head)
        vocab = sum(len(s.encode()) + 8 for f in self.fields for s in self.vocab[f])
        return {"parameters": int(params), "vocabulary": int(vocab), "total": int(params + vocab)}

    def save(self, directory: str | Path, graph: PairGraph | None = None) -> Path:
        """Writes ``pcf_gnn.json``, ``pcf_gnn.npz`` (and the graph, for the table baseline)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        arrays = {"nodes": self.nodes, "relations": self.relations}
        for i, (w, b) in enumerate(self.head):
            arrays[f"head_{i}_kernel"] = w
            arrays[f"head_{i}_bias"] = b
        np.savez(d / ARRAYS_FILE, **arrays)
        meta = {
            "fields": self.fields,
            "vocab": self.vocab,
            "multi": self.multi,
            "pairs": [list(p) for p in self.pairs],
            "head_layers": len(self.head),
            "prior": self.prior,
            "alpha": self.alpha,
            "config": self.config,
            "history": self.history,
        }
        (d / ARTIFACT_FILE).write_text(json.dumps(meta))
        if graph is not None:
            graph.save(d / GRAPH_DIR)
        return d

    @classmethod
    def load(cls, directory: str | Path) -> PCFArtifact:
        d = Path(directory)
        if not (d / ARTIFACT_FILE).exists():
            raise FileNotFoundError(
                f"{d}: no {ARTIFACT_FILE}; create it with `stitchrec crosses pcf-gnn --config ...`"
            )
        meta = read_json_object(d / ARTIFACT_FILE, _WHAT)
        try:
            with np.load(d / ARRAYS_FILE) as z:
                nodes = z["nodes"]
                relations = z["relations"]
                layers = range(meta["head_layers"])
                head = [(z[f"head_{i}_kernel"], z[f"head_{i}_bias"]) for i in layers]
            return cls(
                fields=meta["fields"],
                vocab=meta["vocab"],
                multi=meta["multi"],
                pairs=[(p[0], p[1]) for p in meta["pairs"]],
                nodes=nodes,
                relations=relations,
                head=head,
                prior=meta["prior"],
                alpha=meta["alpha"],
                config=meta.get("config", {}),
                history=meta.get("history", []),
            )
        except (KeyError, IndexError, TypeError, ValueError, OSError, zipfile.BadZipFile) as e:
            raise CrossArtifactError(
                f"PCF-GNN artifact {str(d)!r} cannot be read ({type(e).__name__}: {e}): "
                f"expected {_WHAT}"
            ) from None
