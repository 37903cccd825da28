"""The two errors of the weight tools: one for bad input checkpoints, one for bad converted files."""

from __future__ import annotations


class ConversionError(ValueError):
    """A HuggingFace checkpoint that cannot be converted (the message says what is wrong and where)."""


class FormatError(ValueError):
    """A converted ftbert directory that is missing, damaged, or of another format version."""
