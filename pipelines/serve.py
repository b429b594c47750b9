"""Placeholder: the helper building this command replaces this module."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    del sub
