"""``stitchrec crosses {fives,pcf-gnn}``: learned cross-feature generators.

Each generator registers its own sub-command: ``pipelines.crosses_fives`` and
``pipelines.crosses_pcf``.
"""

from __future__ import annotations

import argparse

from pipelines import crosses_fives, crosses_pcf


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("crosses", help="search or pre-train cross features (FIVES, PCF-GNN)")
    csub = p.add_subparsers(dest="generator", required=True)
    crosses_fives.register(csub)
    crosses_pcf.register(csub)
